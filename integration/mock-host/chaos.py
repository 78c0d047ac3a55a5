#!/usr/bin/python3
"""hixl-mock-host under random faults, many runs (integration/mock-host/README.md, "Chaos").

Each run draws, from its own seed, a mode, transport, model, layout, TP sizes, request
count, concurrency, prompt range, lease, queue time, load-failure policy, timeouts and
a fault with a random --fault-at (or none), runs hixl-mock-host once under a hard
wall-clock bound, and judges it:

  always    the run ends within the host's --timeout (else HANG), options accepted,
            every request ended, no byte wrong (but mismatch-heads), every side that
            reported holds zero blocks (the host's pool and the plugin's blocks_held),
            every instance that reported exited cleanly (a sanitizer's finding shows
            here), and no sanitizer log was written;
  verdict   the host's own verdict (exit 0: the fault's check in mh_report.c), unless
            a lease shorter than the run's hand-offs could take may expire for a
            request (then its load fails by design: tolerated, and counted, when the
            plugin counted the expiry or the failure says lease).

Every run prints its seed and full command, so that any failure replays:
    integration/mock-host/chaos.py --build build-test --replay SEED
Usage:
    integration/mock-host/chaos.py --build build-test --runs 300 [--first-seed 1] [--tsan-log DIR]
"""
import argparse
import collections
import glob
import json
import os
import random
import shlex
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
HEAD_MAJOR = ["packed", "LBHNC", "LHBNC", "BLHNC", "BHLNC"]
ALL_LAYOUTS = ["kv_first", "blocks_first", "cross_layer", "LBNHC", "BLNHC"] + HEAD_MAJOR
HEADS = {"tiny": 2, "llama8b": 8, "mla": 1, "hybrid": 2, "gqa8": 8}
FAULTS = ["none", "none", "decode-dies", "prefill-dies", "link-cut", "link-reset", "decode-aborts",
          "mismatch-block", "mismatch-dtype", "intruder", "decode-rank-dies", "mismatch-heads"]


def tp_ok(tp, heads):
    return (tp <= heads and heads % tp == 0) or (tp > heads and tp % heads == 0)


def draw(seed, timeout_s):
    """The run's options from its seed: (argv after the binary, facts the judge needs)."""
    g = random.Random(seed)
    fault = g.choice(FAULTS)
    model = g.choices(["tiny", "llama8b", "mla", "hybrid", "gqa8"], [50, 4, 14, 14, 18])[0]
    if fault in ("decode-rank-dies", "mismatch-heads") and model in ("llama8b", "hybrid"):
        model = "gqa8"
    if fault == "mismatch-heads" and model == "mla":
        model = "gqa8"
    mode = g.choice(["pull", "push"])
    transport = g.choice(["tcp", "shm", "auto"])
    heads = HEADS[model]
    ptp = dtp = 1
    if model in ("gqa8", "mla", "tiny") and g.random() < 0.35:
        ptp, dtp = g.choice([1, 2, 4]), g.choice([1, 2, 4])
    if fault in ("decode-rank-dies", "mismatch-heads") and dtp < 2:
        dtp = g.choice([2, 4])
    if fault == "mismatch-heads" and dtp > heads:
        dtp = 2
    if fault in ("link-cut", "link-reset"):
        ptp = 1
    if model != "mla" and not (tp_ok(ptp, heads) and tp_ok(dtp, heads)):
        ptp = dtp = 1
    # layout: MLA any but kv_first; hybrid no cross_layer; TP sizes that differ: head-major
    if model == "mla":
        layouts = [l for l in ALL_LAYOUTS if l != "kv_first"]
    elif ptp != dtp:
        layouts = HEAD_MAJOR
    else:
        layouts = [l for l in ALL_LAYOUTS if not (model == "hybrid" and l == "cross_layer")]
    layout = g.choice(layouts) if g.random() < 0.7 else None
    if layout is None and model == "hybrid" and ptp != dtp:
        layout = "packed"
    kv_memory = g.choice(["hixl", "host"])
    if model == "llama8b":
        requests, minp, maxp = g.randint(3, 8), 16, g.choice([64, 256, 512])
    elif model == "mla":
        requests, minp, maxp = g.randint(3, 24), 16, g.choice([64, 256, 512, 1024])
    else:
        requests, minp, maxp = g.randint(3, 32), g.randint(1, 32), 64
    minp = min(minp, maxp)
    conc = g.randint(1, 8)
    policy = g.choice(["fail", "recompute"])
    lease = g.choice([300, 500, 800, 1200, 1500, 2000, 3000, 30000])
    queue = g.choice([0, 0, 0, 100, 400, 1000]) if mode == "pull" else 0
    ttimeout = g.choice([500, 1000, 3000])
    ntimeout = g.choice([300, 500, 1000])
    at = None
    if fault in ("decode-dies", "decode-aborts"):
        at = g.randint(1, requests)
    elif fault == "prefill-dies":
        at = g.randint(1, requests - 1)
    elif fault == "link-cut":
        requests = max(requests, conc + 3)
        at = g.randint(1, requests - conc - 1)  # a request is dispatched after the fault
    elif fault == "link-reset":  # a request ended before it (a link to shut down), one after it
        requests = max(requests, 2 * conc + 3)
        at = g.randint(conc + 1, requests - conc - 1)
    elif fault == "decode-rank-dies":
        requests = max(requests, conc + 3)
        at = g.randint(conc + 1, requests - 1)  # some verified before the rank goes
    if fault in ("decode-dies", "prefill-dies", "decode-rank-dies") and lease > 3000:
        lease = 3000  # what the dead side held or expected ends at its lease: waves of 30 s are slow
    if fault == "link-cut" and mode == "push" and lease > 3000:
        # decode waits out its lease for each push the stopped prefill owes (a wave while
        # it is stopped, one more for the parts it still owed), and once more for pushes
        # that fail after it resumed within connect_timeout_ms of a Link the stop cut
        # (kv_pusher.c's link_all: not dialled again, the consumer not told): three waves
        # of 30 s outlasted the 90 s run (seed 30209)
        lease = 3000
    if fault == "link-reset":
        transport = "tcp"  # it shuts down TCP connections; a same-host link (auto, shm) has none
        lease = 30000  # pull: a lease expired fails it by design (mh_report.c)
        ttimeout = max(ttimeout, 3000)
    a = ["--model", model, "--mode", mode, "--transport", transport, "--requests", str(requests),
         "--concurrency", str(conc), "--min-prompt", str(minp), "--max-prompt", str(maxp),
         "--seed", str(seed), "--lease-ms", str(lease), "--on-load-failure", policy,
         "--kv-memory", kv_memory, "--set", "transfer_timeout_ms=%d" % ttimeout,
         "--set", "notify_timeout_ms=%d" % ntimeout, "--timeout", str(timeout_s)]
    if layout:
        a += ["--layout", layout]
    if ptp != 1 or dtp != 1:
        a += ["--prefill-tp", str(ptp), "--decode-tp", str(dtp)]
    if queue:
        a += ["--queue-ms", str(queue)]
    if fault != "none":
        a += ["--fault", fault]
    if at is not None:
        a += ["--fault-at", str(at)]
    facts = dict(seed=seed, fault=fault, mode=mode, transport=transport, model=model, tp=(ptp, dtp),
                 lease=lease, queue=queue, requests=requests, layout=layout or "default")
    return a, facts


def judge(facts, rc, out, err, js, wall, hard, sanlogs):
    """(class, why): class is ok, tolerated or FAIL / HANG."""
    if rc is None:
        return "HANG", "no exit within %d s (the driver killed it)" % hard
    if "timed out after" in err:
        return "HANG", "the host's --timeout ran out: " + err.split("timed out after", 1)[1].split("\n")[0]
    if rc == 2:
        return "FAIL", "options refused (the driver's bug): " + err.strip().splitlines()[-1]
    if sanlogs:
        return "FAIL", "sanitizer report(s): " + " ".join(sanlogs)
    if js is None:
        return "FAIL", "no --json summary (rc %d)" % rc
    why = []
    if "reported, then" in err:
        why.append("an instance exited unclean after its report")
    ended = js["verified"] + js["recomputed"] + js["failed"] + js["corrupt"]
    if ended != js["requests"]:
        why.append("%d of %d requests ended" % (ended, js["requests"]))
    if js["corrupt"] and facts["fault"] != "mismatch-heads":
        why.append("%d CORRUPT" % js["corrupt"])
    for side in ("prefill", "decode"):
        s = js[side]
        if s["reported"] and (s["blocks_free"] != s["blocks_total"] or s["blocks_held"]):
            why.append("%s holds blocks at exit (pool %d of %d free, plugin blocks_held %d)" %
                       (side, s["blocks_free"], s["blocks_total"], s["blocks_held"]))
        for r, q in enumerate(js.get(side + "_ranks", [])):
            if q["alive"] and q["blocks_held"]:
                why.append("%s rank %d blocks_held %d" % (side, r, q["blocks_held"]))
    if "twice" in out:
        why.append("a rank reported a request twice")
    if why:
        return "FAIL", "; ".join(why)
    if rc == 0:
        return "ok", ""
    if (facts["fault"] == "prefill-dies" and facts["mode"] == "push" and js["verified"] == js["requests"]):
        # push: prefill dies after its Nth request_finished; every push can land first (seed 41403)
        return "not-applied", "every push landed before prefill died: nothing was lost"
    if facts["fault"] == "link-reset" and "shut down 0 TCP connection" in err:
        return "not-applied", "prefill had no TCP connection at that hand-off: nothing was reset"
    # The host's verdict failed while every invariant held: a short lease may have run out.
    expired = js["prefill"]["lease_expired"] > 0 or "lease" in err.lower()
    if facts["lease"] <= 3000 and expired:
        return "tolerated", "lease %d ms ran out for a request (by design)" % facts["lease"]
    return "FAIL", "the host's verdict: " + " | ".join(
        l.strip() for l in (out + err).splitlines() if "FAIL" in l or "NOT handled" in l or "failed" in l)[:600]


def run_one(host, seed, timeout_s, logdir, tsan_log, extra_env):
    argv, facts = draw(seed, timeout_s)
    jpath = os.path.join(logdir, "run-%d.json" % seed)
    if os.path.exists(jpath):
        os.unlink(jpath)
    cmd = [host, "--no-progress", "--config", os.path.join(HERE, "mock-pd.json"), "--json", jpath] + argv
    env = dict(os.environ, **extra_env)
    before = set(glob.glob(tsan_log + "*")) if tsan_log else set()
    hard = timeout_s + 60
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=hard)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)  # our own run's process group only
        out, err = p.communicate()
        rc = None
    wall = time.monotonic() - t0
    sanlogs = sorted(set(glob.glob(tsan_log + "*")) - before) if tsan_log else []
    js = None
    try:
        with open(jpath) as f:
            js = json.load(f)
    except (OSError, ValueError):
        pass
    cls, why = judge(facts, rc, out, err, js, wall, hard, sanlogs)
    with open(os.path.join(logdir, "run-%d.log" % seed), "w") as f:
        f.write("$ %s\nrc %s wall %.1f s: %s %s\n--- stdout\n%s--- stderr\n%s" %
                (shlex.join(cmd), rc, wall, cls, why, out, err))
    return facts, cmd, rc, wall, cls, why


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build-test", help="build directory (its hixl-mock-host and plugin)")
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--replay", type=int, help="run this one seed")
    ap.add_argument("--timeout", type=int, default=90, help="the host's --timeout per run (s)")
    ap.add_argument("--logdir", default="/tmp/hixl-chaos", help="each run's log and summary")
    ap.add_argument("--tsan-log", help="TSAN_OPTIONS log_path prefix; a new file fails the run")
    ap.add_argument("--san-log", help="a sanitizer's log_path prefix set by the caller (ASAN_OPTIONS); "
                    "a new file fails the run")
    ap.add_argument("--budget-s", type=int, default=0, help="stop starting runs after this many seconds")
    a = ap.parse_args()
    host = os.path.join(a.build, "integration", "mock-host", "hixl-mock-host")
    if not os.access(host, os.X_OK):
        sys.exit("chaos: %s is not built (cmake --build %s --target hixl-mock-host)" % (host, a.build))
    os.makedirs(a.logdir, exist_ok=True)
    env = {}
    if a.tsan_log:
        env["TSAN_OPTIONS"] = "log_path=%s halt_on_error=0 %s" % (a.tsan_log, os.environ.get("TSAN_OPTIONS", ""))
    seeds = [a.replay] if a.replay is not None else range(a.first_seed, a.first_seed + a.runs)
    count = collections.Counter()
    bad = []
    t_start = time.monotonic()
    for seed in seeds:
        if a.budget_s and time.monotonic() - t_start > a.budget_s:
            print("chaos: budget of %d s spent; stopping" % a.budget_s, flush=True)
            break
        facts, cmd, rc, wall, cls, why = run_one(host, seed, a.timeout, a.logdir, a.tsan_log or a.san_log, env)
        print("seed %d: %s rc %s %.1f s %s\n  %s" % (seed, cls, rc, wall, why, shlex.join(cmd)), flush=True)
        count["runs"] += 1
        count["class " + cls] += 1
        for k in ("mode", "transport", "fault", "model"):
            count["%s %s" % (k, facts[k])] += 1
        count["tp %d/%d" % facts["tp"]] += 1
        count["lease %s" % ("short" if facts["lease"] <= 3000 else "long")] += 1
        if facts["queue"]:
            count["queue-ms"] += 1
        if cls in ("FAIL", "HANG"):
            bad.append((seed, cls, why))
    print("chaos: counts: " + ", ".join("%s=%d" % kv for kv in sorted(count.items())))
    for seed, cls, why in bad:
        print("chaos: %s seed %d (%s): replay: %s --build %s --replay %d" % (cls, seed, why, sys.argv[0], a.build,
                                                                           seed))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
