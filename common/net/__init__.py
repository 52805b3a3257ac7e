"""Process plumbing shared by every role: ZMQ CURVE keys, addresses, wakers and subprocess helpers
(torch-free)."""
