"""The `snaptime` case: snapshot create, linked clone and snapshot delete
times at two data sizes, and the background reclaim after deleting a
snapshot whose every grain was overwritten."""
import json
import os
import time

from ..common import timed
from ..fio import fill
from ..servers import Strata


def case_snaptime(work, q):
    sizes = [1, 2] if q else [1, 8]
    out = {}
    s = Strata(os.path.join(work, "snaptime")).start()
    try:
        # The CLI's own start-up and round trip, to read the figures against.
        out["cli_round_trip_ms"] = min(timed(lambda: s.cli("status")) for _ in range(5))
        for g in sizes:
            name = f"d{g}"
            s.cli("create", name, "--size", f"{g}G")
            fill(s.uri(name), f"{g}G")
            out[f"{g}GiB"] = {
                "snapshot_create_ms": timed(lambda: s.cli("snapshot", "create", name, "s")),
                "linked_clone_ms": timed(lambda: s.cli("clone", f"{name}@s", f"{name}c")),
                "snapshot_delete_ms": timed(lambda: s.cli("snapshot", "delete", name, "s")),
            }
            # Consolidation: a snapshot whose every grain was overwritten since.
            s.cli("snapshot", "create", name, "u")
            fill(s.uri(name), f"{g}G")
            out[f"{g}GiB"]["delete_unique_snapshot_ms"] = timed(lambda: s.cli("snapshot", "delete", name, "u"))
            t = time.perf_counter()
            while json.loads(s.cli("status", "--json"))["reclaiming"]:
                time.sleep(0.05)
            out[f"{g}GiB"]["background_reclaim_s"] = round(time.perf_counter() - t, 2)
    finally:
        s.stop()
    return out
