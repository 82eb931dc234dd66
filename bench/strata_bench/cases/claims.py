"""The `claims` case (issue 25): create-only writes of one key by 2, 8 and
32 racers at once, SeaweedFS on loopback."""
import json
import os
import random
import subprocess

from ..common import example, smoke
from ..seaweedfs import start_seaweedfs, stop_seaweedfs


def case_claims(work, q):
    """Issue 25: create-only writes under contention, as hosts racing to
    claim one disk send them (each claim is a create-only PUT of the next
    manifest). Per racer count (2, 8, 32), rounds of that many threads
    creating one fresh key at the same instant (the create_race example of
    strata-s3, SeaweedFS on loopback): p50/p99/max latency over
    every create, the winners' and the losers' apart, and the errors."""
    rounds = smoke(2, 10 if q else 20)
    race = example("strata-s3", "create_race", ["testing"])
    weed, endpoint = start_seaweedfs(work)
    try:
        env = dict(os.environ, STRATA_RACE_URL=f"s3://strata-bench/claims-{random.randrange(1 << 32):08x}")
        out = subprocess.run([race, str(rounds),
                              "2", "8", "32"], env=env, capture_output=True, text=True, timeout=1800)
        if out.returncode != 0:
            raise RuntimeError(f"create_race failed: {out.stderr[-2000:]}")
        rows = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        stop_seaweedfs(weed)
    res = {"params": {"rounds": rounds, "store": f"SeaweedFS on loopback ({endpoint})"}}
    for r in rows:
        res[f"racers_{r['racers']}"] = r
    return res
