"""The `multihost` case (issue 12): a disk of an object-store datastore
(SeaweedFS on loopback) vs the same disk in a local datastore."""
import json
import os
import random
import shutil
import subprocess
import time

from ..common import drop_caches, ratio, sh, size_bytes, smoke
from ..fio import fio, fio_iops_log, span
from ..seaweedfs import (UPLOAD_DEPTH, ObjectStoreStrata, start_seaweedfs, stop_seaweedfs,
                         store_ceiling)
from ..servers import Strata


def fio_flush_every(uri, bs, n, runtime, size):
    """4k random writes with a FLUSH every N writes: IOPS and the FLUSH
    latency percentiles (ms)."""
    out = sh("fio", "--name=b", "--ioengine=nbd", f"--uri={uri}", "--rw=randwrite", f"--bs={bs}",
             "--iodepth=16", f"--fsync={n}", f"--runtime={span(runtime)}", "--time_based",
             f"--size={size}", "--randrepeat=0", "--output-format=json", "--group_reporting",
             "--percentile_list=50:90:99:99.9")
    job = json.loads(out[out.index("{"):])["jobs"][0]
    sync = job.get("sync", {})
    lat = sync.get("lat_ns", {})
    pct = lat.get("percentile", {})
    ms = lambda k: round(pct[k] / 1e6, 2) if k in pct else None
    return {"iops": round(job["write"]["iops"]), "flushes": sync.get("total_ios"),
            "flush_p50_ms": ms("50.000000"), "flush_p90_ms": ms("90.000000"),
            "flush_p99_ms": ms("99.000000"), "flush_max_ms": round(lat.get("max", 0) / 1e6, 2)}


def _first_read_ms(uri):
    t = time.perf_counter()
    sh("qemu-io", "-r", "-f", "raw", "-c", "read 0 4k", uri)
    return round((time.perf_counter() - t) * 1000, 1)


def case_multihost(work, q):
    """Issue 12: a disk of an object-store datastore (SeaweedFS on
    loopback, one host) against the same disk in a local datastore, same
    fio, same run. Warm 4k random read (the local segment cache holds what
    the owner wrote) [>= 0.9]; 4k random write with a FLUSH every 64 writes
    (each FLUSH uploads a segment and commits a manifest: its latency
    percentiles); 512k sequential write with a FLUSH at the end; a cold start
    (server restarted with its cache deleted, host page cache dropped):
    time to the first byte, IOPS per 250 ms until it reaches 90% of the
    warm figure (measured again after the random writes, on the layout
    they left); a same-host restart that keeps the cache, the same
    figure [<= 0.5 s]; 4k random reads of a hot quarter of the disk with
    the cache bound at half of it, against local reading the same quarter
    (warm: after one in-order read and one random pass, both reported)
    [>= 0.9]. First, the store's own ceiling in the same run (raw 8 MiB
    PUT/GET throughput at the upload pipeline's depth, one 256 KiB
    create-only PUT's latency, 4 KiB ranged GETs at 16 in flight: what a
    cache miss costs): object-store figures are given as ratios
    to local and to it."""
    size = smoke("64M", "256M" if q else "1G")
    rt = smoke(2, 5 if q else 15)
    # A quarter of the disk (the hot set), and a cache bound of half of it
    # (--store-cache takes 64M at least).
    quarter = f"{size_bytes(size) // 4 >> 20}M"
    half_cache = f"{max(64, size_bytes(size) // 2 >> 20)}M"
    weed, endpoint = start_seaweedfs(work)
    out = {"params": {"size": size, "runtime_s": rt, "store": f"SeaweedFS on loopback ({endpoint})",
                      "client": "fio nbd engine, iodepth 16"}}
    try:
        ceiling = store_ceiling(smoke(1, 3 if q else 5), UPLOAD_DEPTH)
        out["store_ceiling"] = ceiling
        local = Strata(os.path.join(work, "local")).start()
        try:
            local.cli("create", "d", "--size", size)
            lw = fio(local.uri("d"), "write", "512k", iodepth=16, size=size,
                     extra=["--end_fsync=1"])
            lr = fio(local.uri("d"), "randread", "4k", runtime=rt, size=size)
            lf = fio_flush_every(local.uri("d"), "4k", 64, rt, size)
            # The hot quarter, read warm (the capped-cache row below).
            lq = fio(local.uri("d"), "randread", "4k", runtime=rt, size=quarter)
        finally:
            local.stop()
        url = f"s3://strata-bench/multihost-{random.randrange(1 << 32):08x}"
        sh_ = ObjectStoreStrata(os.path.join(work, "host-a"), url)
        sh_.cli("create", "d", "--size", size)
        sh_.start()
        try:
            t = time.perf_counter()
            sw = fio(sh_.uri("d"), "write", "512k", iodepth=16, size=size,
                     extra=["--end_fsync=1"])
            fill_s = time.perf_counter() - t
            sr = fio(sh_.uri("d"), "randread", "4k", runtime=rt, size=size)
            sf = fio_flush_every(sh_.uri("d"), "4k", 64, rt, size)
            # Warm again on the layout the random writes left (thousands of
            # small FLUSH payloads, compacted in part): the reference of the
            # cold start and the restart below, which read that layout.
            sr2 = fio(sh_.uri("d"), "randread", "4k", runtime=rt, size=size)
        finally:
            sh_.stop()
        out["seq_write_512k"] = {"local_mib_s": round(lw["bw_mib"], 1),
                                 "shared_mib_s": round(sw["bw_mib"], 1),
                                 "ratio": ratio(sw["bw_mib"], lw["bw_mib"]),
                                 "ceiling_mib_s": ceiling["put_mib_s"],
                                 "ratio_to_ceiling": ratio(sw["bw_mib"], ceiling["put_mib_s"]),
                                 "target": ">= 0.70 local, >= 0.90 ceiling",
                                 "shared_fill_s": round(fill_s, 1)}
        out["rand_read_4k_warm"] = {"local_iops": round(lr["iops"]), "shared_iops": round(sr["iops"]),
                                    "ratio": ratio(sr["iops"], lr["iops"]), "target": ">= 0.9",
                                    "shared_iops_after_writes": round(sr2["iops"]),
                                    "ratio_after_writes": ratio(sr2["iops"], lr["iops"])}
        put = ceiling["create_256k_ms"]
        out["rand_write_4k_flush64"] = {
            "local": lf, "shared": sf, "ratio": ratio(sf["iops"], lf["iops"]),
            "target": ">= 0.40",
            "ceiling_create_256k_p50_ms": put["p50"],
            "flush_p50_to_ceiling": ratio(sf["flush_p50_ms"] or 0, put["p50"]),
            "flush_p99_to_ceiling": ratio(sf["flush_p99_ms"] or 0, put["p50"]),
            "target_to_ceiling": "p50 <= 1.3, p99 <= 2"}
        # Cold start: the local directory's cache deleted (another host's view).
        shutil.rmtree(os.path.join(sh_.ds, "cache"), ignore_errors=True)
        drop_caches()
        sh_.start()
        try:
            first = _first_read_ms(sh_.uri("d"))
            again = _first_read_ms(sh_.uri("d"))
            logs = os.path.join(work, "coldlogs")
            os.makedirs(logs, exist_ok=True)
            cr, samples = fio_iops_log(sh_.uri("d"), "randread", "4k", 16, rt * 2, size, logs,
                                       "cold")
        finally:
            sh_.stop()
        warm = sr2["iops"]
        full_at = next((t for t, v in samples if v >= 0.9 * warm), None)
        out["cold_start"] = {"first_read_ms": first, "warm_read_ms": again,
                             "seconds_to_90pct_of_warm": full_at,
                             "cold_run_iops": round(cr["iops"]), "warm_iops": round(warm),
                             "iops_per_250ms_first_8": [v for _, v in samples[:8]]}
        # A same-host restart: the cache directory kept (its files are
        # verified on first use, FORMAT.md §11.8), the page cache too (a
        # process restart, not a reboot).
        sh_.start()
        try:
            t = time.perf_counter()
            _first_read_ms(sh_.uri("d"))
            rr, samples = fio_iops_log(sh_.uri("d"), "randread", "4k", 16, rt, size, logs,
                                       "restart")
            opened_s = time.perf_counter() - t
        finally:
            sh_.stop()
        at = next((t for t, v in samples if v >= 0.9 * warm), None)
        out["restart_same_host"] = {
            "seconds_to_90pct_of_warm": at, "run_iops": round(rr["iops"]),
            "warm_iops": round(warm), "iops_per_250ms_first_4": [v for _, v in samples[:4]],
            "target": "<= 0.5 s", "wall_s": round(opened_s, 1)}
        # The cache bound at half the disk, reads over a hot quarter of it,
        # warm (the quarter read once, in order, first), against local
        # reading the same quarter.
        sh_.serve_args = ["--store-cache", half_cache]
        sh_.start()
        try:
            fio(sh_.uri("d"), "read", "256k", iodepth=4, size=quarter)
            # The first random pass is the cache learning the hot set (whole
            # objects shrink to the grains read after 5 s): reported, and
            # the pass after it is the warm figure.
            c0 = _cache(sh_)
            cq0 = fio(sh_.uri("d"), "randread", "4k", runtime=rt, size=quarter)
            c1 = _cache(sh_)
            cq = fio(sh_.uri("d"), "randread", "4k", runtime=rt, size=quarter)
            c2 = _cache(sh_)
        finally:
            sh_.stop()
            sh_.serve_args = []
        hit_share = lambda a, b: ratio(b["hits"] - a["hits"],
                                       (b["hits"] + b["misses"]) - (a["hits"] + a["misses"]))
        out["rand_read_4k_capped_cache"] = {
            "cache_bound": half_cache, "hot_set": quarter,
            "local_iops": round(lq["iops"]), "shared_iops": round(cq["iops"]),
            "ratio": ratio(cq["iops"], lq["iops"]), "target": ">= 0.9",
            "cache_bytes": c2["bytes"], "cache_bound_bytes": c2["bound_bytes"],
            "hit_share_measured": hit_share(c1, c2),
            "first_pass_iops": round(cq0["iops"]), "first_pass_ratio": ratio(cq0["iops"], lq["iops"]),
            "first_pass_hit_share": hit_share(c0, c1), "shrunk": c2.get("shrunk"),
            # What a miss costs here: the store's own 4 KiB ranged GETs
            # with 16 in flight (the ceiling's row); the passes' misses per
            # second against it.
            "store_range_4k_iops_qd16": ceiling.get("range_4k_qd16", {}).get("iops"),
            "first_pass_misses_per_s": round((c1["misses"] - c0["misses"]) / rt),
            "misses_per_s": round((c2["misses"] - c1["misses"]) / rt)}
    finally:
        stop_seaweedfs(weed)
    return out


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _metrics(port):
    """The server's /metrics samples: {name: value} (labels dropped: the
    case serves one disk)."""
    import urllib.request
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, v = line.rpartition(" ")
            out[name.split("{")[0]] = float(v)
    return out


def _cache(s):
    """The segment cache's figures from `strata status --json`."""
    return json.loads(s.cli("status", "--json"))["object_store"]["cache"]


def _space(s):
    g = json.loads(s.cli("gc", "--dry-run", "--json"))
    return g["stored_bytes"], g["live_bytes"]


def _churn(s, disk, nbytes, size, every):
    """4k random overwrites of twice the disk (FLUSH every 64) through fio
    while `gc --dry-run` samples stored / live every `every` seconds:
    (IOPS, seconds, [(t, stored/live)])."""
    args = ["fio", "--name=b", "--ioengine=nbd", f"--uri={s.uri(disk)}", "--rw=randwrite",
            "--bs=4k", "--iodepth=16", "--fsync=64", f"--size={size}",
            f"--io_size={2 * nbytes}", "--randrepeat=0", "--output-format=json",
            "--group_reporting"]
    t0 = time.perf_counter()
    p = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    samples = []
    while p.poll() is None:
        time.sleep(every)
        st, lv = _space(s)
        samples.append((round(time.perf_counter() - t0, 1), round(st / max(lv, 1), 3)))
    out = p.stdout.read()
    seconds = time.perf_counter() - t0
    job = json.loads(out[out.index("{"):])["jobs"][0]
    return round(job["write"]["iops"]), round(seconds, 1), samples


def case_compaction(work, q):
    """Issue 27 item 6: compaction (FORMAT.md §11.7a) under 4k random
    overwrites of twice the disk's size with a FLUSH every 64 writes (each
    FLUSH a 256 KiB payload that later overwrites leave partly live), on a
    disk first filled sequentially, in two runs on two stores: the server
    with its automatic passes off (--compact-policy off: what overwrites
    cost the store with GC alone), then on (busy passes at 50 %, idle
    passes at 85 % after --compact-idle, 30 s without a write, 5 s in a
    smoke run; GC at most every 5 s while passes move grains). Stored / live sampled every few seconds during the churn
    [<= 1.5] and, with compaction, after it while idle [<= 1.2 within five
    minutes]; the churn's IOPS with compaction / without; compaction's
    write amplification = (client + rewritten) / client bytes [<= 2]."""
    size = smoke("64M", "256M" if q else "1G")
    weed, endpoint = start_seaweedfs(work)
    every = smoke(1, 3)
    out = {"params": {"size": size, "store": f"SeaweedFS on loopback ({endpoint})",
                      "client": "fio nbd engine, 4k randwrite, iodepth 16, fsync=64, "
                                "2x the disk's size, after a sequential fill"}}
    try:
        runs = {}
        for mode in ("off", "on"):
            port = _free_port()
            url = f"s3://strata-bench/compaction-{mode}-{random.randrange(1 << 32):08x}"
            s = ObjectStoreStrata(os.path.join(work, f"host-{mode}"), url)
            s.serve_args = ["--http", f"127.0.0.1:{port}", "--gc-interval", "5",
                            "--compact-policy", "auto" if mode == "on" else "off",
                            "--compact-idle", str(smoke(5, 30))]
            s.cli("create", "d", "--size", size)
            s.start()
            try:
                fio(s.uri("d"), "write", "1M", iodepth=8, size=size, extra=["--end_fsync=1"])
                nbytes = int(json.loads(s.cli("info", "d", "--json"))["size_bytes"])
                iops, seconds, during = _churn(s, "d", nbytes, size, every)
                after, settled_at = [], None
                t1 = time.perf_counter()
                while mode == "on" and time.perf_counter() - t1 < smoke(45, 330):
                    time.sleep(smoke(3, 10))
                    st, lv = _space(s)
                    after.append((round(time.perf_counter() - t1, 1), round(st / max(lv, 1), 3)))
                    if after[-1][1] <= 1.2:
                        settled_at = after[-1][0]
                        break
                m = _metrics(port)
            finally:
                s.stop()
            runs[mode] = {"iops": iops, "seconds": seconds, "samples": during, "after": after,
                          "settled_at": settled_at, "metrics": m}
        on, off = runs["on"], runs["off"]
        client = on["metrics"].get("strata_shared_client_bytes_total", 0)
        rewritten = on["metrics"].get("strata_shared_compact_rewritten_bytes_total", 0)
        peak = lambda r: max((x for _, x in r["samples"]), default=None)
        out["churn"] = {
            "iops_without": off["iops"], "iops_with": on["iops"],
            "iops_ratio": ratio(on["iops"], off["iops"]),
            "seconds_with": on["seconds"],
            "stored_to_live_max_without": peak(off), "stored_to_live_end_without":
                off["samples"][-1][1] if off["samples"] else None,
            "stored_to_live_max": peak(on),
            "stored_to_live_median": sorted(x for _, x in on["samples"])[len(on["samples"]) // 2]
                if on["samples"] else None,
            "samples": on["samples"], "samples_without": off["samples"], "target": "<= 1.5"}
        out["idle"] = {"stored_to_live": on["after"][-1][1] if on["after"] else None,
                       "seconds_to_1_2": on["settled_at"], "samples": on["after"],
                       "target": "<= 1.2 within 300 s"}
        out["compaction"] = {
            "client_mib": round(client / 2**20, 1), "rewritten_mib": round(rewritten / 2**20, 1),
            "passes": on["metrics"].get("strata_shared_compact_passes_total"),
            "dropped_grains": on["metrics"].get("strata_shared_compact_dropped_grains_total"),
            "write_amplification": ratio(client + rewritten, client) if client else None,
            "target": "<= 2"}
    finally:
        stop_seaweedfs(weed)
    return out
