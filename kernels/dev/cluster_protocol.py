#!/usr/bin/env python3
# A model of the cluster-reduced backward's buffer protocol (kernels/attention_flash_wgmma.cuh,
# kDqCluster, the lab's b22), run over random interleavings on the CPU: L live blocks of a cluster,
# NB buffers per block; per block 8 consumer warps (a barrier of the 256 consumer threads per step)
# and 4 writer warps. A consumer warp waits for its buffer's `empty` barrier (use u − 1 read by every
# writer), writes its part, arrives on the `full` barrier of every live block; a writer warp waits for
# its block's `full` (use u written by every source), reads every source's buffer, arrives on every
# source's `empty`; at the end a block's consumers wait for the last uses' `empty` before the block
# may exit. mbarrier model: try_wait.parity(P) succeeds once the phase of parity P has completed,
# i.e. iff (completed phases & 1) != P. Checks: every read sees the step the writer expects, nothing
# arrives on a block that has exited, no deadlock.
#   python3 kernels/dev/cluster_protocol.py            the protocol: "ok N interleavings"
#   python3 kernels/dev/cluster_protocol.py --mutants  three broken variants, each must fail
import random
import sys

MUTANT = None  # 'no-empty-wait', 'no-final-wait', 'full-count'

class Bar:
    def __init__(s, n): s.n = n; s.pending = n; s.phase = 0
    def arrive(s):
        s.pending -= 1
        assert s.pending >= 0
        if s.pending == 0: s.phase += 1; s.pending = s.n
    def ready(s, parity): return (s.phase & 1) != parity
def run(L, NB, n, seed):
    rnd = random.Random(seed)
    full = [[Bar(8 if MUTANT == 'full-count' else 8 * L) for _ in range(NB)] for _ in range(L)]
    empty = [[Bar(4 * L) for _ in range(NB)] for _ in range(L)]
    buf = [[[None] * 8 for _ in range(NB)] for _ in range(L)]  # [block][bf][consumer warp] = step written
    alive = [True] * L
    csync = [dict() for _ in range(L)]  # step -> arrivals
    def consumer(r, w):
        for step in range(n):
            csync[r][step] = csync[r].get(step, 0) + 1
            while csync[r][step] < 8: yield
            u, bf = step // NB, step % NB
            if u > 0 and MUTANT != 'no-empty-wait':
                while not empty[r][bf].ready((u - 1) & 1): yield
            buf[r][bf][w] = step
            yield
            for d in range(L):
                assert alive[d], "arrive on an exited block"
                full[d][bf].arrive(); yield
        for step in range(max(0, n - NB), n) if MUTANT != 'no-final-wait' else ():
            while not empty[r][step % NB].ready((step // NB) & 1): yield
    def writer(r, w):
        for step in range(n):
            u, bf = step // NB, step % NB
            while not full[r][bf].ready(u & 1): yield
            for src in range(L):
                assert alive[src]
                for cw in range(8):
                    assert buf[src][bf][cw] == step, (r, w, src, cw, buf[src][bf][cw], step)
                    yield
            for d in range(L):
                assert alive[d], "arrive on an exited block"
                empty[d][bf].arrive(); yield
    procs = {}
    for r in range(L):
        for w in range(8): procs[('c', r, w)] = consumer(r, w)
        for w in range(4): procs[('w', r, w)] = writer(r, w)
    live = set(procs)
    stall = 0
    while live:
        k = rnd.choice(sorted(live))
        try:
            next(procs[k])
        except StopIteration:
            live.discard(k)
            r = k[1]
            if not any(x[1] == r for x in live): alive[r] = False
        stall += 1
        if stall > 10**7: raise RuntimeError('no progress (deadlock?) L=%d NB=%d n=%d' % (L, NB, n))
    return True
def sweep():
    cases = 0
    for L in (1, 2, 3, 4, 8):
        for NB in (2, 4):
            for n in (1, 2, 3, 5, 9):
                for seed in range(12 if L < 8 else 4):
                    run(L, NB, n, seed)
                    cases += 1
    return cases
if __name__ == '__main__':
    if '--mutants' in sys.argv[1:]:
        bad = 0
        for m in ('no-empty-wait', 'no-final-wait', 'full-count'):
            MUTANT = m
            try:
                sweep()
                print('mutant %s: NOT caught' % m)
                bad += 1
            except (AssertionError, RuntimeError) as e:
                print('mutant %s: caught (%s)' % (m, type(e).__name__))
        sys.exit(1 if bad else 0)
    print('ok', sweep(), 'interleavings')
