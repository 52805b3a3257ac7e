"""Process plumbing shared by every role (torch-free): ZMQ sockets (sockets.py: every option in one
place), CURVE keys, addresses and the IPv6 bracket rule, KV transport names, config fields as flags,
wakers and subprocess helpers."""
