"""A rogue process for the authenticated-cluster tests: real ZMQ sockets, no keys or the wrong ones.

    python -m tests.helpers.rogue push  ADDR HEX [--keys none|wrong|cluster] [--seconds S]
    python -m tests.helpers.rogue fetch ADDR HEX [--keys ...] [--seconds S]

`push` connects a PUSH socket to ADDR and keeps sending the message HEX (hex of the encoded bytes) for
S seconds, as a worker would push to the router or a peer. `fetch` connects a DEALER to a KV sender,
sends the fetch request HEX and waits S seconds for any reply: exit status 3 if one came, 0 if not.
Keys: `none` is a plain socket; `wrong` presents a fresh keypair while knowing the cluster's public key
(read from $PDSERVE_CURVE_PUBLIC_KEY, the strongest rogue short of holding the secret); `cluster` uses
the cluster's keys from the environment (the control: an honest client).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

import zmq

from common.net.curve import PUBLIC_ENV, CurveKeys


def _secure(sock: zmq.Socket, keys: str) -> None:
    if keys == "cluster":
        cluster = CurveKeys.from_env()
        assert cluster is not None, "the cluster keys must be in the environment"
        cluster.dial(sock)
    elif keys == "wrong":
        own = CurveKeys.generate()
        sock.setsockopt(zmq.CURVE_SERVERKEY, os.environ[PUBLIC_ENV].encode("ascii"))
        sock.setsockopt(zmq.CURVE_PUBLICKEY, own.public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, own.secret)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["push", "fetch"])
    p.add_argument("addr")
    p.add_argument("hex")
    p.add_argument("--keys", choices=["none", "wrong", "cluster"], default="none")
    p.add_argument("--seconds", type=float, default=2.0)
    args = p.parse_args()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH if args.mode == "push" else zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    _secure(sock, args.keys)
    sock.connect(args.addr)
    payload = bytes.fromhex(args.hex)
    deadline = time.monotonic() + args.seconds
    got_reply = False
    if args.mode == "fetch":
        sock.send(payload)
        got_reply = bool(sock.poll(int(args.seconds * 1000)))
    else:
        while time.monotonic() < deadline:
            with contextlib.suppress(zmq.Again):  # no handshake completed: nothing to queue on
                sock.send(payload, zmq.NOBLOCK)
            time.sleep(0.05)
    sock.close()
    ctx.term()
    return 3 if got_reply else 0


if __name__ == "__main__":
    sys.exit(main())
