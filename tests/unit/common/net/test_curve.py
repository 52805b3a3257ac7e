"""The cluster's CURVE keys (common/net/curve.py): validation, the environment hand-over, no leaks, and a
CURVE server that admits only the cluster key (real sockets)."""

from __future__ import annotations

import contextlib

import pytest
import zmq

from common.net.curve import PUBLIC_ENV, SECRET_ENV, CurveKeys, close_guard, guard


def test_keys_are_checked_and_the_secret_never_shows() -> None:
    keys, other = CurveKeys.generate(), CurveKeys.generate()
    assert keys.secret.decode() not in repr(keys) and keys.public.decode() in repr(keys)
    with pytest.raises(ValueError, match="public is not the public key"):
        CurveKeys(other.public, keys.secret)
    with pytest.raises(ValueError, match="40-character"):
        CurveKeys(b"short", keys.secret)


def test_the_environment_hands_keys_over_and_can_be_emptied() -> None:
    keys = CurveKeys.generate()
    env = {"OTHER": "x", **keys.to_env()}
    assert CurveKeys.from_env(env) == keys and PUBLIC_ENV in env
    assert CurveKeys.from_env(env, pop=True) == keys and env == {"OTHER": "x"}
    assert CurveKeys.from_env(env) is None
    with pytest.raises(ValueError, match="set together"):
        CurveKeys.from_env({PUBLIC_ENV: keys.public.decode()})
    with pytest.raises(ValueError, match=SECRET_ENV):
        CurveKeys.from_env({PUBLIC_ENV: keys.public.decode(), SECRET_ENV: "x" * 40})


def test_a_guarded_server_admits_only_the_cluster_key() -> None:
    keys, rogue = CurveKeys.generate(), CurveKeys.generate()
    server_ctx, client_ctx = zmq.Context(), zmq.Context()
    g = guard(server_ctx, keys, "test")
    pull = server_ctx.socket(zmq.PULL)
    keys.serve(pull)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    socks = []
    try:
        for client_keys in (None, rogue):
            push = client_ctx.socket(zmq.PUSH)
            socks.append(push)
            push.setsockopt(zmq.LINGER, 0)
            if client_keys is not None:  # knows the server's key, presents its own pair
                push.setsockopt(zmq.CURVE_SERVERKEY, keys.public)
                push.setsockopt(zmq.CURVE_PUBLICKEY, client_keys.public)
                push.setsockopt(zmq.CURVE_SECRETKEY, client_keys.secret)
            push.connect(f"tcp://127.0.0.1:{port}")
            for _ in range(5):
                with contextlib.suppress(zmq.Again):
                    push.send(b"rogue", zmq.NOBLOCK)
        assert not pull.poll(1000)  # no handshake completed: nothing arrives
        honest = client_ctx.socket(zmq.PUSH)
        honest.setsockopt(zmq.LINGER, 0)
        keys.dial(honest)
        honest.connect(f"tcp://127.0.0.1:{port}")
        socks.append(honest)
        honest.send(b"hello")
        assert pull.poll(5000) and pull.recv() == b"hello"
    finally:
        for s in [*socks, pull]:
            s.close(linger=0)
        close_guard(g)
        server_ctx.term()
        client_ctx.term()
