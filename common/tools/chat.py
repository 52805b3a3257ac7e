"""Answer one question with the offline engine: the demo of the whole engine on the default model.

    python -m common.tools.chat [--model PATH] [--max-tokens N] [--temperature T] "question"

With no `--model`, the default model (SmolLM2-135M-Instruct) is prepared once and used.
"""

from __future__ import annotations

import argparse
import sys


def question_messages(question: str, system: str | None = None) -> list[dict]:
    """The conversation that asks `question` (after an optional system message)."""
    if not question.strip():
        raise ValueError("question must not be empty")
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": question})
    return messages


def build_chat_prompt(tokenizer, question: str, system: str | None = None) -> str:
    """Format `question` (and an optional system message) with the tokenizer's chat template,
    ending with the assistant turn's opening so the model writes the answer."""
    messages = question_messages(question, system)
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def answer(model: str, question: str, params, system: str | None = None) -> str:
    """Load the engine on `model` and return its answer to `question` under SamplingParams `params`."""
    # Imported here so `--help` and argument errors do not pay for loading torch.
    from common import LLM

    return LLM(model).chat(question_messages(question, system), params, use_tqdm=False)[0]["text"].strip()


PROG = "python -m common.tools.chat"


def _parse_args(argv: list[str] | None, prog: str = PROG) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("question", help="the question to answer")
    parser.add_argument("--model", default=None, help="HF-format model directory (default: SmolLM2-135M)")
    parser.add_argument("--max-tokens", type=int, default=128, help="answer length limit (default 128)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 means greedy (default 0)")
    parser.add_argument("--system", default=None, help="optional system message")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    """`prog`: the command the usage line names (`pdserve chat` when run through the console script)."""
    args = _parse_args(argv, prog)
    from common.tools.default_model import resolve_model
    from common.wire.sampling_params import SamplingParams

    # Validate user input up front so mistakes get a one-line error; engine errors keep their traceback.
    try:
        if not args.question.strip():
            raise ValueError("question must not be empty")
        params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens)
        model = resolve_model(args.model)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(answer(model, args.question, params, args.system))
    return 0


if __name__ == "__main__":
    sys.exit(main())
