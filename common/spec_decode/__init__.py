"""Speculative decoding, one seam: the scheduler composes a `Speculator` (speculator.py) that the engine
builds (proposer_speculator.build_speculator). Inside: proposers that only draft (speculative.py's
n-gram lookup, draft_proposer.py's draft model), exact acceptance (speculative.accept_drafts), and the
cost policy that decides when drafting pays (spec_policy.py, step_clock.py)."""
