"""A fake router inbox: a bound PULL socket and its address, for the channels' real-socket tests."""

from __future__ import annotations

import pytest
import zmq


@pytest.fixture
def router_inbox():
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.LINGER, 0)
    pull.bind("tcp://127.0.0.1:*")
    yield pull, pull.getsockopt_string(zmq.LAST_ENDPOINT)
    pull.close(linger=0)
    ctx.term()
