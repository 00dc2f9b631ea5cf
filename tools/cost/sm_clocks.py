"""The SMs' side of the block scheduler's replay (sm_sim.Sim): each SM's free footprint, its
clock and the CTAs working on it, the rate they share and what they ask of HBM and L2, and when
the next phase ends."""
from __future__ import annotations

import heapq

# a CTA working on an SM: [phase end on the SM's clock, share, HBM B/s, L2 B/s, grid, its
# phases, the phase it is in]
END, SHARE, HBM, L2, GRID, PHASES, AT = range(7)


class SmClocks:
    """Each SM's clock (the work done at full rate by each of its CTAs), the virtual time it was
    read at, its rate (1, or 1 / the sum of the shares of the CTAs working on it), those CTAs,
    what they ask of HBM and L2 at that rate (and the chip's totals), and the heap of each SM's
    next phase end in virtual time, whose stale entries a later version retires."""

    def __init__(self, sms: int, capacity: tuple[int, ...]):
        self.free = [list(capacity) for _ in range(sms)]     # each SM's free footprint
        self.clock = [0.0] * sms
        self.read_at = [0.0] * sms
        self.speed = [1.0] * sms
        self.on = [[] for _ in range(sms)]
        self.asks = [(0.0, 0.0)] * sms
        self.version = [0] * sms
        self.dirty: list[int] = []
        self.is_dirty = [False] * sms
        self.ask_hbm = self.ask_l2 = 0.0
        self.work: list = []                      # (virtual end, seq, sm, version)
        self.seq = 0

    def read(self, sm: int, v: float) -> None:
        """Bring SM `sm`'s clock to virtual time v; mark it for `settle`."""
        dv = v - self.read_at[sm]
        if dv:
            self.clock[sm] += dv * self.speed[sm]
            self.read_at[sm] = v
        if not self.is_dirty[sm]:
            self.is_dirty[sm] = True
            self.dirty.append(sm)

    def settle(self) -> None:
        """Each SM whose CTAs changed: its rate, its asks of HBM and L2, its next phase end."""
        for sm in self.dirty:
            self.is_dirty[sm] = False
            on = self.on[sm]
            shares = hbm = l2 = 0.0
            for c in on:
                shares += c[SHARE]
                hbm += c[HBM]
                l2 += c[L2]
            speed = 1.0 if shares <= 1.0 else 1.0 / shares
            hbm, l2 = speed * hbm, speed * l2
            old = self.asks[sm]
            self.ask_hbm += hbm - old[0]
            self.ask_l2 += l2 - old[1]
            self.asks[sm] = (hbm, l2)
            self.speed[sm] = speed
            self.version[sm] += 1
            if on:
                first = min(c[END] for c in on)
                self.seq += 1
                heapq.heappush(self.work, (self.read_at[sm] + max(0.0, first - self.clock[sm]) / speed,
                                           self.seq, sm, self.version[sm]))
        self.dirty = []

    def enter(self, c: list, sm: int) -> None:
        """CTA `c` starts its phase c[AT] on SM `sm` (whose clock is read)."""
        seconds, share, hbm, l2 = c[PHASES][c[AT]]
        c[END], c[SHARE], c[HBM], c[L2] = self.clock[sm] + seconds, share, hbm, l2

    def rate(self, hbm_bw: float, l2_bw: float) -> float:
        """The chip's work rate: 1, or less where the SMs ask HBM or L2 for more than it gives."""
        r = 1.0
        if self.ask_hbm > hbm_bw:
            r = hbm_bw / self.ask_hbm
        if self.ask_l2 > l2_bw:
            r = min(r, l2_bw / self.ask_l2)
        return r

    def fits(self, sm: int, n) -> bool:
        f = self.free[sm]
        return (f[0] >= n[0] and f[1] >= n[1] and f[2] >= n[2] and f[3] >= n[3] and f[4] >= n[4]
                and f[5] >= n[5] and f[6] >= n[6])

    def room(self, sm: int, need) -> int:
        """How many more CTAs of footprint `need` SM `sm` takes."""
        f = self.free[sm]
        return min(f[k] // need[k] for k in range(len(need)) if need[k])

    def next_end(self):
        """The earliest current (virtual end, seq, sm, version), or None."""
        while self.work and self.work[0][3] != self.version[self.work[0][2]]:
            heapq.heappop(self.work)              # an end its SM has since moved
        return self.work[0] if self.work else None
