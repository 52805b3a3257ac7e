"""Speculative decoding: n-gram and draft-model proposers, acceptance and the cost policy that decides
when drafting pays."""
