"""The time-driven workloads send what they promise (the HTTP side is serving.py's, tested there)."""

from __future__ import annotations

import asyncio

from benchmarks.serving.workloads import LONG_OUTPUT_TOKENS, Turn, interference, multi_turn


def test_interference_keeps_chat_clients_busy_while_long_prompts_arrive() -> None:
    sent: list[tuple[float, Turn]] = []

    async def send(turn: Turn) -> str:
        sent.append((asyncio.get_running_loop().time(), turn))
        await asyncio.sleep(0.01)
        return "ok"

    results, seconds = asyncio.run(interference(send, 0.3, 4, 8, 5, 50, 10.0, seed=1))
    chats = [t for _, t in sent if t.kind == "chat"]
    longs = [t for _, t in sent if t.kind == "long"]
    assert len(longs) == 3 and all(len(t.prompt) == 50 and t.max_tokens == LONG_OUTPUT_TOKENS for t in longs)
    assert len(chats) >= 4 * 20 and all(len(t.prompt) == 8 and t.max_tokens == 5 for t in chats)
    assert len(results) == len(sent) and seconds >= 0.3
    assert {kind for kind, _ in results} == {"chat", "long"}


def test_multi_turn_prompts_extend_the_previous_turn() -> None:
    by_conversation: dict[int, list[Turn]] = {}

    async def send(turn: Turn) -> str:
        key = next(
            (
                k
                for k, turns in by_conversation.items()
                if turn.prompt[: len(turns[-1].prompt)] == turns[-1].prompt
            ),
            None,
        )
        by_conversation.setdefault(len(by_conversation) if key is None else key, []).append(turn)
        await asyncio.sleep(0)
        return "ok"

    results, _ = asyncio.run(multi_turn(send, 3, 4, input_len=6, output_len=2, max_concurrency=2, seed=0))
    assert len(results) == 12 and [k for k, _ in results].count("turn1") == 3
    assert len(by_conversation) == 3
    for turns in by_conversation.values():
        assert [len(t.prompt) for t in turns] == [6, 14, 22, 30]  # + answer (2) + new message (6) a turn
