"""The authenticated cluster: ZMQ CURVE on every router-worker and worker-worker socket.

One keypair per cluster, made by the launcher (`CurveKeys.generate`) and handed to the router and every
worker through their environment (`PDSERVE_CURVE_PUBLIC_KEY`, `PDSERVE_CURVE_SECRET_KEY`, z85 text):
never on a command line (any user of the host can read those with `ps`), never in a log or a repr.
The environment of a process is readable only by its own user (and root), like a 0600 file, and it
leaves nothing on disk to clean up after a crash; each process takes the keys out of its environment
as it starts (`from_env(pop=True)`), so nothing it spawns later inherits them.

Every socket that binds is a CURVE server holding the cluster's secret key; every socket that connects
is a CURVE client that presents the cluster keypair and expects the server to hold the cluster key. A
ZAP handler on each context that binds (`CurveGuard`) admits only clients presenting the cluster's
public key, and CURVE's handshake proves they also hold its secret key. So a process without the keys
(or with other keys) cannot complete a handshake: it cannot register, send token outputs, send
commands, read cache events or fetch KV. Messages on an admitted connection are also encrypted.

Without keys (no variables set: `python -m router` / a worker run by hand), sockets stay plain, as
before; the router logs that its inbox is unauthenticated.
"""

from __future__ import annotations

import hmac
import logging
import os
import time
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # zmq is imported where used: configs that hold keys must not load it (kvtransfer)
    import zmq

log = logging.getLogger(__name__)

PUBLIC_ENV, SECRET_ENV = "PDSERVE_CURVE_PUBLIC_KEY", "PDSERVE_CURVE_SECRET_KEY"
Z85_KEY_CHARS = 40  # a 32-byte key in z85
REFUSAL_LOG_S = 60.0


@dataclass(frozen=True)
class CurveKeys:
    """The cluster's CURVE keypair (z85 bytes). The secret never appears in a repr."""

    public: bytes
    secret: bytes = field(repr=False)

    def __post_init__(self) -> None:
        for name in ("public", "secret"):
            value = getattr(self, name)
            if not isinstance(value, bytes) or len(value) != Z85_KEY_CHARS:
                raise ValueError(f"{name} must be a {Z85_KEY_CHARS}-character z85 CURVE key")
        import zmq

        try:
            derived = zmq.curve_public(self.secret)
        except (zmq.ZMQError, ValueError):
            raise ValueError("secret is not a z85 CURVE key") from None
        if not hmac.compare_digest(derived, self.public):
            raise ValueError("public is not the public key of secret")

    @classmethod
    def generate(cls) -> CurveKeys:
        import zmq

        public, secret = zmq.curve_keypair()
        return cls(public, secret)

    @classmethod
    def from_env(cls, environ: MutableMapping[str, str] | None = None, pop: bool = False) -> CurveKeys | None:
        """The keys from the environment (None when neither variable is set); ValueError naming the
        variable when only one is set or either is malformed. `pop` removes them from `environ`."""
        env = os.environ if environ is None else environ
        get = env.pop if pop else env.get
        public, secret = get(PUBLIC_ENV, None), get(SECRET_ENV, None)
        if public is None and secret is None:
            return None
        if not public or not secret:
            raise ValueError(f"{PUBLIC_ENV} and {SECRET_ENV} must be set together")
        try:
            return cls(public.encode("ascii"), secret.encode("ascii"))
        except (UnicodeEncodeError, ValueError) as e:
            raise ValueError(f"{PUBLIC_ENV} / {SECRET_ENV}: {e}") from None

    def to_env(self) -> dict[str, str]:
        """The variables that hand these keys to a child process."""
        return {PUBLIC_ENV: self.public.decode("ascii"), SECRET_ENV: self.secret.decode("ascii")}

    def serve(self, sock: zmq.Socket) -> None:
        """Make `sock` (before it binds) a CURVE server holding the cluster key."""
        import zmq

        sock.setsockopt(zmq.CURVE_SECRETKEY, self.secret)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.public)
        sock.setsockopt(zmq.CURVE_SERVER, 1)

    def dial(self, sock: zmq.Socket) -> None:
        """Make `sock` (before it connects) a CURVE client presenting the cluster keypair."""
        import zmq

        sock.setsockopt(zmq.CURVE_SERVERKEY, self.public)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.secret)


class _ClusterKeyOnly:
    """ZAP credentials check: only the cluster's public key gets in. Refusals are logged once a minute
    per key (a refused peer reconnects every few hundred milliseconds)."""

    def __init__(self, public: bytes, owner: str) -> None:
        self.public, self.owner = public, owner
        self._logged: dict[bytes, float] = {}

    def callback(self, domain: str, key: bytes) -> bool:
        if hmac.compare_digest(key, self.public):
            return True
        now = time.monotonic()
        if now - self._logged.get(key, -REFUSAL_LOG_S) >= REFUSAL_LOG_S and len(self._logged) < 1024:
            self._logged[key] = now
            peer = key.decode("ascii", "replace")  # the peer's public key: safe to log
            log.warning("%s: refused a ZMQ peer presenting CURVE key %s", self.owner, peer)
        return False


class CurveGuard:
    """The ZAP handler of one context: a thread answering the handshakes of its server sockets.
    Start it before any server socket of the context binds; `close` it before the context ends."""

    def __init__(self, context: zmq.Context, keys: CurveKeys, owner: str) -> None:
        from zmq.auth.thread import ThreadAuthenticator

        self._auth = ThreadAuthenticator(context, log=logging.getLogger(f"{__name__}.zap"))
        self._auth.start()
        self._auth.configure_curve_callback("*", _ClusterKeyOnly(keys.public, owner))

    def close(self) -> None:
        self._auth.stop()


def guard(context: zmq.Context, keys: CurveKeys | None, owner: str) -> CurveGuard | None:
    """A started CurveGuard for `context`, or None without keys."""
    return None if keys is None else CurveGuard(context, keys, owner)


def serve(sock: zmq.Socket, keys: CurveKeys | None) -> None:
    if keys is not None:
        keys.serve(sock)


def dial(sock: zmq.Socket, keys: CurveKeys | None) -> None:
    if keys is not None:
        keys.dial(sock)


def close_guard(g: CurveGuard | None) -> None:
    if g is not None:
        g.close()
