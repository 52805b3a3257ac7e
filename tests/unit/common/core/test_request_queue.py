"""The admission policy (FCFS): arrival order, preempted requests first, the newest running one is
the victim; checked against a plain list doing the same operations."""

from __future__ import annotations

import random

import pytest

from common.core.request_queue import RequestQueue


def test_first_come_first_served_with_preempted_requests_first():
    q: RequestQueue[str] = RequestQueue()
    for rid in ("a", "b", "c"):
        q.push(rid)
    q.requeue("z")  # preempted: it was admitted before everything still waiting
    assert q.peek() == "z" and [q.pop() for _ in range(len(q))] == ["z", "a", "b", "c"]
    assert not q
    with pytest.raises(IndexError):
        q.peek()


def test_the_most_recently_admitted_running_request_is_the_victim():
    assert RequestQueue.victim(["first", "second", "third"]) == "third"


def test_random_operations_match_a_list_in_arrival_order():
    rng = random.Random(0)
    q: RequestQueue[int] = RequestQueue()
    reference: list[int] = []
    for item in range(300):
        op = rng.choice(("push", "requeue", "pop", "remove"))
        if op == "push":
            q.push(item)
            reference.append(item)
        elif op == "requeue":
            q.requeue(item)
            reference.insert(0, item)
        elif reference and op == "pop":
            assert q.peek() == reference[0] and q.pop() == reference.pop(0)
        elif reference:
            gone = rng.choice(reference)
            q.remove(gone)
            reference.remove(gone)
            assert gone not in q
        assert list(q) == reference and len(q) == len(reference)
