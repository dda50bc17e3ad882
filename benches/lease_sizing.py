#!/usr/bin/env python3
"""How many Redis calls a decision leases cost on the bench's Zipf mix.

A model of `floodgate bench --backend URL --lease`'s Zipf rows (100,000
clients drawn by Zipf(1), one calling thread, a limit never reached), with
round trips taking no time: each client's two lease slots, a lease asked
ahead when half of the last is spent, and one of two sizing rules:

  double  the limiter's: a lease that lands less than a term after the one
          before doubles the next size; units that lapse halve it;
  rate    the units spent since the last landing, scaled to a term.

It prints the calls per decision over the second after a one-second warm-up
(as the bench measures), and the floor no sizing can go under: a lease
covers its own request and those that come within a term after it, so a
client seen at rate r costs at least r / (1 + r * term) calls a second.

    benches/lease_sizing.py [DECISIONS_PER_SECOND] [double|rate] [TERM_S]
"""
import bisect
import math
import random
import sys

CLIENTS = 100_000
MOST = 1 << 20
rate = float(sys.argv[1]) if len(sys.argv) > 1 else 34_000
sizing = sys.argv[2] if len(sys.argv) > 2 else "double"
term = float(sys.argv[3]) if len(sys.argv) > 3 else 1.0

cumulative = []
total = 0.0
for rank in range(CLIENTS):
    total += 1 / (rank + 1)
    cumulative.append(total)
harmonic = total
random.seed(1)


class Client:
    def __init__(self):
        self.slots = [(0, 0.0), (0, 0.0)]  # (units, end)
        self.size = 1
        self.last = -1e9  # the last landing
        self.previous = 0  # the last lease's size


clients = {}
calls = 0


def spend(client, now):
    live = [i for i, (units, end) in enumerate(client.slots) if units > 0 and now < end]
    if not live:
        return None
    slot = min(live, key=lambda i: client.slots[i][1])
    units, end = client.slots[slot]
    client.slots[slot] = (units - 1, end)
    return units - 1


def held(client, now):
    return sum(units for units, end in client.slots if units > 0 and now < end)


def take(client, now, size, cost, left_before=0):
    global calls
    calls += 1
    left = size - cost
    if left > 0:
        for i, (units, end) in enumerate(client.slots):
            if units == 0 or now >= end:
                if units > 0:  # lapsed unspent
                    client.size = max(1, client.size // 2)
                client.slots[i] = (left, now + term)
                break
    since = now - client.last
    if sizing == "double":
        if since < term:
            client.size = min(client.size * 2, MOST)
    else:
        spent = client.previous - (left_before if cost == 0 else 0)
        if since < term and spent > 0:
            client.size = max(1, min(MOST, int(spent * term / since)))
    client.previous = size
    client.last = now


now, step, measured_calls, measured = 0.0, 1 / rate, 0, 0
while now < 2.0:
    rank = bisect.bisect_left(cumulative, random.random() * harmonic)
    client = clients.setdefault(rank, Client())
    before = calls
    left = spend(client, now)
    if left is None:
        take(client, now, client.size, 1)
    elif client.size >= 2 and left <= client.size // 2 and held(client, now) == left:
        take(client, now, client.size, 0, left)
    if now >= 1.0:
        measured += 1
        measured_calls += calls - before
    now += step

floor = sum(
    (rate / harmonic / (k + 1)) / (1 + rate / harmonic / (k + 1) * term) for k in range(CLIENTS)
) / rate
print(
    f"{rate:.0f} decisions/s, term {term:g} s, {sizing}: "
    f"{measured_calls / measured:.3f} calls a decision (floor {floor:.3f})"
)
