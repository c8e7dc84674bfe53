"""Ring collectives over point-to-point send/recv: what the fabric can carry, apart from how
well a collective library uses it.

Why this exists: torch's gloo ReduceScatter and AllGather exchange data send-before-receive,
and on a 2-host 1 Gbit/s lab an isend/irecv exchange posted in that order ran at half duplex,
twice as long as with the receive posted first (docs/BENCHMARKS.md). These rings always
post the receive first, so `--algo ring` shows the link's capability while the default
(`--algo torch`) shows what FSDP really gets from the library. Both use the same buffers,
sizes and checks, so the two columns compare directly.

ReduceScatter (n ranks, chunk c): step k sends the running partial sum of chunk (r-k-1) mod n
to the right and receives the left's partial of chunk (r-k-2) mod n, adds this rank's input
chunk to it; after n-1 steps the partial is the full sum of chunk r. The input is never
written (out-of-place semantics) except chunk r itself when the output aliases it.
AllGather: step k forwards chunk (r-k) mod n to the right and receives chunk (r-k-1) mod n.
AllReduce: ReduceScatter into the rank's own chunk, then AllGather in place.
"""

from __future__ import annotations

from typing import Any

import torch


class Ring:
    def __init__(self, dist: Any, rank: int, size: int, peers: list[int] | None = None):
        # rank and size within the ring; peers[i] is ring member i's global rank (a subgroup's
        # ring talks point-to-point over the world, to its members only).
        self.dist, self.rank, self.size = dist, rank, size
        peers = list(range(size)) if peers is None else peers
        self.right, self.left = peers[(rank + 1) % size], peers[(rank - 1) % size]
        self._scratch: dict[tuple[int, Any, Any], tuple[Any, Any]] = {}

    def exchange_ops(self, send: Any, recv: Any) -> list[Any]:
        """One ring step as a P2POp list, receive first (see the module docstring for why)."""
        dist = self.dist
        return [dist.P2POp(dist.irecv, recv, self.left), dist.P2POp(dist.isend, send, self.right)]

    def _exchange(self, send: Any, recv: Any) -> None:
        # One batch_isend_irecv: on NCCL it groups the receive and the send (ncclGroupStart/End),
        # without which NCCL serializes point-to-point calls to one peer on one stream and two
        # ranks that each send before their receive is posted deadlock. gloo, which cannot
        # coalesce, gets the two calls in the list's order: receive first, as before.
        for work in self.dist.batch_isend_irecv(self.exchange_ops(send, recv)):
            work.wait()

    def _buffers(self, like: Any) -> tuple[Any, Any]:
        key = (like.numel(), like.dtype, like.device)
        if key not in self._scratch:
            self._scratch = {key: (like.new_empty(like.shape), like.new_empty(like.shape))}
        return self._scratch[key]

    def reduce_scatter(self, output: Any, inp: Any) -> None:
        n, r = self.size, self.rank
        chunks = inp.chunk(n)
        if n == 1:
            if output.data_ptr() != chunks[0].data_ptr():
                output.copy_(chunks[0])
            return
        outgoing, incoming = self._buffers(chunks[0])
        to_send = chunks[(r - 1) % n]
        for step in range(n - 1):
            self._exchange(to_send, incoming)
            target = (r - step - 2) % n
            if step == n - 2:
                assert target == r
                output.copy_(incoming.add_(chunks[r]))
            else:
                torch.add(incoming, chunks[target], out=outgoing)
                to_send = outgoing

    def all_gather(self, output: Any, inp: Any) -> None:
        n, r = self.size, self.rank
        chunks = output.chunk(n)
        if chunks[r].data_ptr() != inp.data_ptr():
            chunks[r].copy_(inp)
        for step in range(n - 1):
            self._exchange(chunks[(r - step) % n], chunks[(r - step - 1) % n])

    def all_reduce(self, buf: Any) -> None:
        own = buf.chunk(self.size)[self.rank]
        self.reduce_scatter(own, buf)
        self.all_gather(buf, own)
