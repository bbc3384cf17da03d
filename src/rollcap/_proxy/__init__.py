"""What the servers that forward HTTP share: the model server and the capture worker.

``headers``: which headers never cross a proxy, and the one kind of client session to forward
with. ``relay``: a stream relayed chunk by chunk, and a client connection broken off the way
upstream broke its own.
"""
