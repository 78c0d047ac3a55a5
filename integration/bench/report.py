#!/usr/bin/env python3
"""report.py PAGE ARGS...: the pages the run_*.sh scripts write, from their tools' raw outputs (PAGE: perf, cache, obs,
adapter, ab, auth, layouts, pd, pd_dat, tp; each one's docstring names its ARGS). The scripts run the tools (interleaved
rounds, pinning, time limits); this file holds what they compute (medians, ratios, A/A, verdicts) and the pages' text. A
page that is a template is its docs page itself: the prose is written there, once, and report.py rewrites only its
blocks marked <!-- hixl:begin NAME --> ... <!-- hixl:end NAME --> (fill)."""
import collections, csv, glob, json, math, operator, os, platform, re, statistics, subprocess, sys, textwrap, time

NUM = re.compile(r"^[0-9.]+$")
MARK = re.compile(r"<!-- hixl:begin ([\w.-]+) -->(.*?)<!-- hixl:end \1 -->", re.S)


# One-line helpers. r2: a figure to 2 places, or n/a; r2all: every round's so; span: the least and the
# greatest of VS, as 0.00-0.00x; ratio: a / b to 2 places, or n/a; verdict: R against GOAL (OP ge or le).
r2 = lambda v: "n/a" if v == "n/a" else "%.2f" % float(v)
r2all = lambda vs: "/".join(map(r2, vs))
pm = lambda ok: "PASS" if ok else "MISS"
span = lambda vs: "%.2f-%.2fx" % (min(vs), max(vs))
x2 = lambda r: "n/a" if r in (None, "n/a") else "%.2fx" % float(r)  # a ratio as 0.00x, or n/a
sz = lambda b: "%g MiB" % (b / 1048576) if b >= 1048576 else "%g KiB" % (b / 1024)  # a size in bytes, as 4 KiB
ratio = lambda a, b: "n/a" if "n/a" in (a, b) or float(b) == 0 else "%.2f" % (float(a) / float(b))
verdict = lambda r, op, goal: "NOT MEASURED" if r == "n/a" else pm(getattr(operator, op)(float(r), float(goal)))
# md() of ROWS (dicts), each row FORM.format_map(row)
tab = lambda head, align, form, rows: md(head, align, [form.format_map(r) for r in rows])
# (path, its JSON) of every file the glob os.path.join(*PARTS) names, in path order
jsons = lambda *parts: [(f, json.load(open(f))) for f in sorted(glob.glob(os.path.join(*parts)))]
csv_rows = lambda path: list(csv.DictReader(read(path).splitlines()))
# group 1 of PATTERN's first match in the file PATH, or ""
grep = lambda pattern, path, flags=0: (re.search(pattern, read(path), flags) or [None, ""])[1]
# CPUs this process may use (as nproc), kernel, UTC day, load average (1, 5, 15 min)
hostinfo = lambda: (str(len(os.sched_getaffinity(0))), platform.release(), time.strftime("%Y-%m-%d", time.gmtime()),
                    " ".join(read("/proc/loadavg").split()[:3]))
# UTC day, CPUs (os.cpu_count), kernel: where a page's figures were measured
run_on = lambda: "%s (%s CPUs, %s)" % (time.strftime("%Y-%m-%d", time.gmtime()), os.cpu_count(), platform.release())


def median(vs):
    """The median of the values that are numbers, as text: the middle one as written,
    or the mean of the two middle ones to 4 places; n/a when none is a number."""
    v = sorted((x for x in vs if NUM.match(x)), key=float)
    h = len(v) // 2
    return "n/a" if not v else v[h] if len(v) % 2 else "%.4f" % ((float(v[h - 1]) + float(v[h])) / 2)


def md(head, align, rows):
    """A markdown table: HEAD its columns joined by " | ", ALIGN an l or r a column
    ("---|" or "---:|"), ROWS each a list of cells or the cells already joined by " | "."""
    return "\n".join([f"| {head} |", "|" + "".join("---:|" if a == "r" else "---|" for a in align)] +
                     ["| " + (r if isinstance(r, str) else " | ".join(map(str, r))) + " |" for r in rows])


def read(path, default=""):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return default


def get(path, col, **conds):
    """COLUMN of the first row of a CSV file matching every KEY=VALUE, or n/a."""
    return next((r.get(col) or "n/a" for r in csv_rows(path) if all(r.get(k) == str(v) for k, v in conds.items())), "n/a")


def meta(res):
    """KEY=VALUE lines a script wrote beside its tools' outputs; repeated keys collect."""
    m = {}
    for k, _, v in (line.partition("=") for line in read(os.path.join(res, "meta")).splitlines()):
        m.setdefault(k, []).append(v)
    return {k: v if k.endswith("_r") else v[-1] for k, v in m.items()}


def sh(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True).stdout.splitlines()[0].strip()
    except (OSError, IndexError):
        return ""


def cpu_seconds(json_path):
    """User + system CPU seconds of a run (every process), from the .time file beside its JSON; None if absent."""
    try:
        u, s, _ = read(json_path[:-5] + ".time").split()[-3:]
        return float(u) + float(s)
    except ValueError:
        return None


def machine():  # CPU model, memory, kernel, OS
    kib = int(grep(r"^MemTotal\S*\s+(\d+)", "/proc/meminfo", re.M) or 0)
    return (grep(r"^model name[^:]*:(.*)", "/proc/cpuinfo", re.M).strip(), "%.1f GiB" % (kib / 1048576),
            platform.release(), grep(r"^PRETTY_NAME=(.*)", "/etc/os-release", re.M).strip('"') or "unknown")


def fill(template, out, values):
    """Write OUT: the page TEMPLATE (a docs page) with each marked block holding
    values[NAME]; a block whose markers stand on lines of their own keeps them. A block
    without a value, or a value without a block, is an error that names it."""
    text, seen = read(template, None), set()
    if text is None:
        sys.exit(f"report.py: no page template {template}")

    def one(m):
        name, old = m[1], m[2]
        if name not in values:
            sys.exit(f"report.py: {template}: block {name} has no value")
        seen.add(name)
        v = str(values[name]).rstrip("\n")
        return f"<!-- hixl:begin {name} -->" + (f"\n{v}\n" if old.startswith("\n") else v) + f"<!-- hixl:end {name} -->"

    text = MARK.sub(one, text) + "\n"
    if set(values) - seen:
        sys.exit(f"report.py: {template}: no block for {', '.join(sorted(set(values) - seen))}")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        f.write(text)


def perf(res, out, src):
    """docs/performance.md from run_perf.sh's results (RES OUT SRC: RES/meta and the tools' outputs beside it; SRC
    the source tree, whose docs/performance.md is the template)."""
    M = meta(res)
    ROUNDS, PIN, ST_ALL, OPS = int(M["rounds"]), M["pin"], M["st_all"], ("WRITE", "READ")
    R = lambda name: os.path.join(res, name)
    per = lambda f: [f(r) for r in range(1, ROUNDS + 1)]
    # Every round's COLUMN of the row matching CONDS in round<R><SUFFIX>.csv.
    fig = lambda suffix, col, **conds: per(lambda r: get(R(f"round{r}{suffix}.csv"), col, **conds))
    v = {k: M[k] for k in ("elapsed", "start", "busy", "others", "commit", "ucx_env", "st_all", "shm_others")}
    v["nproc"], (v["cpu"], v["mem"], v["kernel"], v["os"]) = hostinfo()[0], machine()
    v["others_rounds"], v["rounds"] = "/".join(M.get("others_r", [])), ROUNDS

    def goal(name, r, *op_goal):  # a ratio's block, and its verdict's if it has a goal
        v[name] = r
        if op_goal:
            v["_".join(("verdict", name) + op_goal).replace(".", "_")] = verdict(r, *op_goal)

    # The targeted figures, every round (block r2all_v_NAME), and their medians (block r2_MEDIAN).
    Med = {}
    for name, median_name, rounds_ in (
            ("tcp4m", "tcp_4m", fig("_tcp", "gbps", mode="stream", streams=1, size=4194304)),
            ("ucx", "ucx_bw", per(lambda r: read(R(f"round{r}_ucx.txt"), "n/a"))),
            ("hw", "h_w4m", fig("", "gbps", mode="sync", op="WRITE", block_size=4194304)),
            ("hr", "h_r4m", fig("", "gbps", mode="sync", op="READ", block_size=4194304)),
            ("trtt", "tcp_rtt", fig("_rtt", "avg_us", mode="rtt")),
            ("trtt99", "tcp_rtt99", fig("_rtt", "p99_us", mode="rtt")),
            ("hrtt", "h_rtt", fig("_lat", "avg_us", mode="latency")),
            ("hrtt99", "h_rtt99", fig("_lat", "p99_us", mode="latency"))):
        Med[name] = median(rounds_)
        v[f"r2all_v_{name}"], v[f"r2_{median_name}"] = r2all(rounds_), r2(Med[name])
    for name, a, b, *g in (("r_w_tcp", "hw", "tcp4m", "ge", "0.8"), ("r_r_tcp", "hr", "tcp4m", "ge", "0.8"),
                           ("r_w_ucx", "hw", "ucx", "ge", "3"), ("r_r_ucx", "hr", "ucx", "ge", "3"),
                           ("r_rtt", "hrtt", "trtt", "le", "1.3"), ("r_rtt99", "hrtt99", "trtt99")):
        goal(name, ratio(Med[a], Med[b]), *g)
    # CS vs engine, figures sw sr (sync) aw ar (async window 4) l l99 (64 B; the latencies have no goal).
    for f, suffix, col, conds, *g in [(m[0] + op[0].lower(), "_cs", "gbps", dict(mode=m, op=op, block_size=4194304),
                                       "ge", "0.95") for m in ("sync", "async") for op in OPS] + [
            ("l", "_cs_lat", "avg_us", dict(mode="latency")), ("l99", "_cs_lat", "p99_us", dict(mode="latency"))]:
        m = {}
        for api in ("cs", "engine"):
            rounds_ = fig(suffix, col, api=api, **conds)
            m[api], v[f"r2all_c_{api}_{f}"], v[f"r2_m_{api}_{f}"] = median(rounds_), r2all(rounds_), r2(median(rounds_))
        goal(f"rc_{f}", ratio(m["cs"], m["engine"]), *g)

    for k, patterns in (("h", ("", "_lat")), ("cs", ("_cs", "_cs_lat")), ("st", ("_st_*",))):
        ok = [row.get("verified") == "yes" for p in patterns for f in glob.glob(R(f"round[0-9]{p}.csv"))
              for row in csv_rows(f) if row.get("tool") == "hixl-bench"]
        n, bad = len(ok), ok.count(False)
        v[f"{k}_verified"] = "nothing ran" if n == 0 else f"{bad} of {n} points NOT verified" if bad else \
            f"all {n} points verified"

    gbps = lambda x: "n/a" if x == "n/a" else f"{r2(x)} GB/s"
    # Staging: round<R>_st_<name>.csv.
    st_rounds = lambda name, op, b, n: fig(f"_st_{name}", "gbps", mode="sync", op=op, block_size=b, batch=n)
    st_median = lambda *a: median(st_rounds(*a))
    for op in OPS:  # 16 KiB blocks x 1024 against 4 MiB ones
        w = op[0].lower()
        st, h = st_median("default", op, 16384, 1024), Med["h" + w]
        v[f"gbps_st_{w}16k"], v[f"gbps_h_{w}4m"], v[f"rx_st_{w}16k_h_{w}4m"] = gbps(st), gbps(h), x2(ratio(st, h))
        v[f"verdict_r_st_{w}_ge_0_7"] = verdict(ratio(st, h), "ge", 0.7)
    SMALL = [(b, op) for b in (64, 512, 1024, 2048, 4096, 16384) for op in OPS]  # blocks x 1024
    UNREG = [(b, op) for b in (65536, 4194304) for op in OPS]  # blocks x 64
    # The default StagingThreshold, from the option table (auto: the tcp-link value).
    ST_DEF = grep(r'(?:\{|X\()"StagingThreshold", *"([^"]*)"', os.path.join(src, "core/src/engine/options.c"))
    if ST_DEF == "auto":
        ST_DEF = grep(r"#define STAGE_AUTO_TCP\s+(\d+)u?", os.path.join(src, "core/src/engine/options.h"))
    ST_DEF = ST_DEF if ST_DEF.isdigit() else ""
    v["st_def_text"] = ST_DEF or "the default"

    # Measured once.
    for name, streams, size in (("1m", 1, 1048576), ("4k", 1, 4096), ("2x4m", 2, 4194304), ("2x4k", 2, 4096)):
        v[f"r2_tcp_{name}"] = r2(get(R("tcp_once.csv"), "gbps", mode="stream", streams=streams, size=size))
    for where in ("free", "same"):
        for who, prefix, mode in (("tcp", "rtt", "rtt"), ("h", "lat", "latency")):
            path = R(f"{prefix}_{where}.csv")
            v[f"{who}_rtt_{where}"] = f"{r2(get(path, 'avg_us', mode=mode))} / {r2(get(path, 'p99_us', mode=mode))}"
    for streams in (1, 2):  # the last "receiver" summary line's rate -> GB/s (10^9 bytes/s)
        rates = [(float(n), {"G": 1e9, "M": 1e6, "K": 1e3}.get(unit[0], 1))
                 for line in read(R(f"iperf3_{streams}.log")).splitlines() if "receiver" in line
                 for n, unit in re.findall(r"(\S+)\s+(\S*bits/sec)(?!\S)", line)]
        v[f"r2_iperf_{streams}"] = r2("%.3f" % (rates[-1][0] * rates[-1][1] / 8 / 1e9) if rates else "n/a")
    v["iperf_version"] = sh(["iperf3", "--version"]) or "iperf3 not found"
    v["ucx_version"] = re.sub(r"^# *", "", sh(["ucx_info", "-v"])) or "not found"
    for op in OPS:
        v[f"r2_ha_{op[0].lower()}4m"] = r2(get(R("hixl_async.csv"), "gbps", mode="async", op=op))
    v["hixl_version"] = grep(r"^# hixl-bench.*?hixl ([^)]*)\):", R("hixl_4m.log"), re.M) or "?"
    v["pin_text"] = ("one process per CPU: initiator / client / sender on CPU 0, target / server / receiver on CPU 1 "
                     "(like two hosts)") if PIN else "not pinned (one CPU only)"

    rows = csv_rows(R("hixl_sweep.csv"))
    v["sweep_table"] = md("op | block | batch | iters | GB/s | avg us | p50 us | p99 us | verified", "lrrrrrrrl", [
        [x["op"], x["block_size"], x["batch"], x["iters"], "%.2f" % float(x["gbps"])] +
        ["%.1f" % float(x[k]) for k in ("avg_us", "p50_us", "p99_us")] + [x["verified"]] for x in rows]) if rows else \
        "(the sweep did not run; see perf-results/hixl_sweep.err)"
    how = lambda b: (" (coalesced)" if b < int(ST_DEF) else " (direct)") if ST_DEF else ""  # what the default does
    v["coalesce_table"] = md(f"block x 1024 | op | direct (0) | default ({v['st_def_text']}) | default / direct | "
                             f"coalesced ({ST_ALL}) | coalesced / direct", "rlrrrrr", [  # direct, default, coalesced
        [f"{b} B", op, gbps(d), gbps(df) + how(b), x2(ratio(df, d)), gbps(al), x2(ratio(al, d))] for b, op in SMALL
        for d, df, al in [[st_median(n, op, b, 1024) for n in ("direct", "default", "coalesced")]]])
    v["unreg_table"] = md(
        "block x 64 | op | registered | unregistered local (staged) | unregistered / registered", "rlrrr",
        [[f"{b // 1024} KiB", op, gbps(reg), gbps(un), x2(ratio(un, reg))] for b, op in UNREG
         for reg, un in [(st_median("registered", op, b, 64), st_median("unregistered", op, b, 64))]])
    st_all = lambda *a: r2all(st_rounds(*a))  # per-round GB/s of every staging figure
    v["stage_rounds_table"] = md(f"figure | op | direct (0) | default | coalesced ({ST_ALL})", "lllll", [
        [f"{b} B x 1024", op] + [st_all(n, op, b, 1024) for n in ("direct", "default", "coalesced")]
        for b, op in SMALL]) + "\n\n" + md("figure | op | registered | unregistered local", "llll", [
        [f"{b // 1024} KiB x 64", op] + [st_all(n, op, b, 64) for n in ("registered", "unregistered")]
        for b, op in UNREG])

    # ----- the shm section. A figure is KIND:OP:BLOCK:BATCH:LAYOUT, as in hixl-shm-ref's CSV.
    SHM_CSV = R("shm.csv")
    MC = {b: f"memcpy:copy:{b}:1:adjacent" for b in (4096, 262144, 1048576, 4194304, 16777216)}
    RV = {b: f"process_vm_readv:READ:{b}:1:adjacent" for b in (4096, 262144, 1048576, 4194304)}
    RVS = "process_vm_readv:READ:4096:1024:scattered"  # one call for 1024 scattered 4 KiB blocks
    # The issue's targets (LABEL, GOAL, FIGURE, REFERENCE, KERNEL): FIGURE / REFERENCE >= GOAL. KERNEL / REFERENCE is
    # the kernel's ceiling: the same ratio with the hixl figure replaced by bare process_vm_readv calls of the same
    # blocks. For adjacent 4 KiB batches that is one call per 256 KiB (the best a batch of 4 KiB ops could reach); for
    # scattered ones, the kernel's own scattered batch.
    targets = [(f"shm {op} {name}, 1 op per call / memcpy {name}", "0.8", f"shm:{op}:{b}:1:adjacent", MC[b], RV[b])
               for b, name in ((262144, "256 KiB"), (1048576, "1 MiB"), (4194304, "4 MiB")) for op in OPS]
    targets += [(f"shm {op} 16 x 256 KiB per call / memcpy 256 KiB", "0.8", f"shm:{op}:262144:16:adjacent",
                 MC[262144], RV[262144]) for op in OPS]
    targets += [(f"shm {op} 1024 x 4 KiB per call, {lay} / one process_vm_readv per 4 KiB", "2",
                 f"shm:{op}:4096:1024:{lay}", RV[4096], kern)
                for lay, kern in (("adjacent", RV[262144]), ("scattered", RVS)) for op in OPS]
    # Issue 15: memory the target allocated (HixlEngineAllocMem), mapped into the
    # initiator and copied with memcpy. (LABEL, GOAL, FIGURE, REFERENCE)
    map_targets = [(f"mapped {op} {name}, 1 op per call / memcpy {name}", "0.9", f"shm-mapped:{op}:{b}:1:adjacent",
                    MC[b]) for b, name in ((262144, "256 KiB"), (1048576, "1 MiB"), (4194304, "4 MiB"),
                                           (16777216, "16 MiB")) for op in OPS]
    map_targets += [(f"mapped {op} 1024 x 4 KiB per call, scattered / one process_vm_readv per 4 KiB", "3",
                     f"shm-mapped:{op}:4096:1024:scattered", RV[4096]) for op in OPS]

    def shm_fig(pages, fig):  # its median GB/s, or n/a
        k, op, b, n, lay = fig.split(":")
        return get(SHM_CSV, "gbps", pages=pages, kind=k, op=op, block_size=b, batch=n, layout=lay)

    shm_ratio = lambda p, f, ref: ratio(shm_fig(p, f), shm_fig(p, ref))

    def shm_result(p, goal, f, ref, k=None):  # PASS, or (with a KERNEL figure) whose the MISS is
        r = verdict(shm_ratio(p, f, ref), "ge", goal)
        return r if r != "MISS" or not k else {"MISS": "MISS, the kernel's too", "PASS": "MISS, hixl's"}.get(
            verdict(shm_ratio(p, k, ref), "ge", goal), r)

    # A target's cells with P pages: its ratio, the kernel's ceiling (with a KERNEL figure), the result.
    cells = lambda p, goal, f, ref, k=None: [x2(shm_ratio(p, f, ref))] + ([x2(shm_ratio(p, k, ref))] if k else []) + \
        [shm_result(p, goal, f, ref, k)]
    for block, ts, ceil in (("shm_target_table", targets, "kernel's ceiling | "), ("shm_map_table", map_targets, "")):
        v[block] = md(f"target (ratio of medians) | goal | 4 KiB pages | {ceil}result | huge pages | {ceil}result",
                      "lr" + ("rrl" if ceil else "rl") * 2,
                      [[label, f">= {t[0]}x"] + [x for p in ("4k", "thp") for x in cells(p, *t)] for label, *t in ts])
    v["shm_map_table"] += f"\n- hixl-shm-ref note: {M['shm_note']}." if M["shm_note"] else ""

    for p, name in (("4k", "4 KiB pages"), ("thp", "Huge pages")):
        # How many targets pass, whose the misses are, hixl against the bare call.
        res_ = [shm_result(p, *t) for _, *t in targets]
        n = [res_.count(x) for x in ("PASS", "MISS, the kernel's too", "MISS, hixl's")]
        eff = sorted((x for x in (shm_ratio(p, f, k) for _, _, f, _, k in targets) if NUM.match(x)), key=float)
        lo, hi = (x2(eff[0]), x2(eff[-1])) if eff else ("n/a", "n/a")
        text = (f"- {name}: {n[0]} of {len(targets)} targets PASS; {n[1]} MISS where the bare kernel call misses "
                f"the goal too (the kernel's limit), {n[2]} where it does not (hixl's). Across the {len(targets)} "
                f"targets hixl moves {lo} to {hi} of the bare kernel call's rate.")
        lines = textwrap.wrap(text, 87, break_long_words=False, break_on_hyphens=False)
        v[f"shm_summary_{p}_{name.lower().replace(' ', '_')}"] = "\n".join(lines[:1] + ["  " + l for l in lines[1:]]) \
            if sum(n) else f"- {name}: not measured."
        # One 4 KiB READ per sync call over one bare process_vm_readv, in us.
        s, k = shm_fig(p, "shm:READ:4096:1:adjacent"), shm_fig(p, RV[4096])
        v[f"shm_op_cost_{p}"] = "n/a" if "n/a" in (s, k) or float(s) <= 0 or float(k) <= 0 else \
            "%.1f us" % (4.096 / float(s) - 4.096 / float(k))
    v["r2_shm_fig_4k_shm_read_4096_1_adjacent"] = r2(shm_fig("4k", "shm:READ:4096:1:adjacent"))
    v["r2_shm_fig_4k_rv_4096"] = r2(shm_fig("4k", RV[4096]))

    rows = csv_rows(SHM_CSV)
    groups, med, rnd = [{}, {}, {}, {}], {}, {}  # groups: figure -> its order (batch, then block)
    for x in rows:
        k, b, n, op, lay = x["kind"], int(x["block_size"]), int(x["batch"]), x["op"], x["layout"]
        shm = "shm mapped " if k == "shm-mapped" else "shm "
        name = {"memcpy": [f"memcpy {sz(b)}"] * 2,  # its name by kind: [one block per call, a batch per call]
                "process_vm_readv": [f"process_vm_readv {sz(b)}, one call per block",
                                     f"process_vm_readv {n} x {sz(b)} in one call, {lay}"]}.get(k, [
            f"{shm}{op} {sz(b)}, 1 op per call",
            f"{shm}{op} {n} x {sz(b)} per call" + (f", {lay}" if b == 4096 else "")])[n > 1]
        g = {"memcpy": 0, "process_vm_readv": 1, "shm": 2}.get(k, 3)  # rows grouped by kind, in CSV order
        groups[g].setdefault(name, n * 1e10 + b)
        med[x["pages"], name] = "%.2f" % float(x["gbps"])
        rnd[x["pages"], name] = "/".join("%.2f" % float(r) for r in x["round_gbps"].split("/"))
    groups[1] = sorted(groups[1], key=groups[1].get)  # kernel calls by batch, then block
    cell = lambda p, name: f"{med[p, name]} | {rnd[p, name]}" if (p, name) in med else "n/a | n/a"
    v["shm_figure_table"] = md("figure (GB/s) | 4 KiB pages | rounds | huge pages | rounds", "lrlrl", [
        f"{name} | {cell('4k', name)} | {cell('thp', name)}" for g in groups for name in g]) if rows else \
        f"(hixl-shm-ref did not run: {M['shm_note'] or 'see perf-results/shm_ref_*.log'})"

    v["shm_span"] = get(SHM_CSV, "span_mib", tool="hixl-shm-ref")
    v["shm_rounds"] = get(SHM_CSV, "rounds", tool="hixl-shm-ref")
    v["shm_pin_text"] = "the initiator on CPU 0, the target process on CPU 1" if PIN else "not pinned (one CPU only)"
    v["shm_cpus"] = "--cpu-initiator 0 --cpu-target 1" if PIN else "--cpu-initiator -1 --cpu-target -1"
    ran = " and ".join(n for p, n in (("4k", "4 KiB pages"), ("thp", "huge pages")) if shm_fig(p, MC[262144]) != "n/a")
    v["shm_check"] = f"passed with {ran}" if ran else "no run finished"
    THP_MODE = grep(r"\[(.*)\]", "/sys/kernel/mm/transparent_hugepage/enabled") or "unknown"
    v["thp_text"] = ("transparent huge pages are off on this kernel (`never`), so the huge-page column is 4 KiB pages "
                     "too" if THP_MODE == "never" else f"this kernel's transparent_hugepage setting: `{THP_MODE}`")

    # The page is docs/performance.md itself; these are its blocks. It leads with the
    # peers' table: docs/performance-peers.md (run_peers.sh) from its "## " heading on.
    peers = read(os.path.join(src, "docs/performance-peers.md"))
    m = re.search(r"^## ", peers, re.M)
    v["peers"] = peers[m.start():] if m else "(no docs/performance-peers.md: integration/peers/run_peers.sh writes it)"
    v["ucx_note"] = (f"\n- UCX note: {M['ucx_note']}. UCX ratios are reported as not measured rather than guessed."
                     if M["ucx_note"] else "")
    v["iperf_note"] = f"\n- iperf3 note: {M['iperf_note']}." if M["iperf_note"] else ""
    fill(os.path.join(src, "docs/performance.md"), out, v)


def cache(res, out, _runs, iters, template=None):
    """docs/performance-cache.md from run_cache.sh's results (RES OUT RUNS ITERS [TEMPLATE]; the runs are RES's
    JSON files), into the blocks of TEMPLATE (default: OUT, the page itself)."""
    v = {"machine": f"{machine()[0] or '?'}, {os.cpu_count()} CPUs, Linux {platform.release()}", "iters": iters}
    for t in ("tcp", "auto"):
        rs = [j["results"] for _, j in jsons(res, f"{t}-*.json")]
        L = []
        for x in zip(*rs):  # a scenario in every run
            sc, m = x[0], lambda k: statistics.median(y[k] for y in x)
            goal = ("met" if m("ratio") >= 0.95 else "missed") if sc["scenario"].startswith("pull") else "(none)"
            L.append([sc["scenario"], f"{m('raw_gbps'):.2f}", f"{m('cache_gbps'):.2f}", sc["raw_ops"], sc["cache_ops"],
                      ", ".join(f"{y['ratio']:.2f}x" for y in x), f"{m('ratio'):.2f}x", goal,
                      "yes" if all(y["verified"] for y in x) else "NO"])
        v[t] = md("scenario | raw GB/s | cache GB/s | raw ops | cache ops | ratio per run | median ratio | goal | "
                  "verified", "l" * 9, L) if rs else "(not measured in this run)"
    fill(template or out, out, v)
    print(f"run_cache: wrote {out}", file=sys.stderr)


def obs(res, out, _cycles, rounds, transport, template=None):
    """docs/performance-obs.md from run_obs.sh's results (RES OUT CYCLES ROUNDS TRANSPORT [TEMPLATE]; the cycles
    are RES's), into the blocks of TEMPLATE (default: OUT, the page itself)."""
    ncpu, kernel, day, load = hostinfo()
    runs = {}  # runs[cycle][k] = its rows: k 1 and 4 off, 2 and 3 on (A B B A)
    for f, j in jsons(res, "obs-*.json"):
        c, k, _ = os.path.basename(f)[4:-5].split("-")
        runs.setdefault(int(c), {})[int(k)] = j["rows"]
    gmean = lambda v: math.exp(sum(math.log(x) for x in v) / len(v))

    # Per cycle, on against off, each the geometric mean of its two runs (A B B A: drift falls on both alike); a cell is
    # the median over cycles. A/A: a cycle's last off run against its first.
    L, cells, aas = [], [], []
    for t in [r["tokens"] for r in runs[min(runs)][2]]:
        row = [str(t)]
        for key, higher in (("plugin_fd_gbs", True), ("plugin_gbs", True), ("push_after_last_ms", False)):
            better = (lambda a, b: a / b) if higher else (lambda a, b: b / a)  # above 1: A beats B
            x = [{k: next(r[key] for r in rows if r["tokens"] == t) for k, rows in cyc.items()}
                 for _, cyc in sorted(runs.items())]  # every cycle's runs' figures
            off, on = [gmean([y[1], y[4]]) for y in x], [gmean([y[2], y[3]]) for y in x]
            ratio = [better(a, b) for a, b in zip(on, off)]
            cells.append(statistics.median(ratio))
            aas.append(statistics.median(better(y[4], y[1]) for y in x))
            row += ["%.2f" % statistics.median(off), "%.2f" % statistics.median(on), "%.3f" % cells[-1],
                    "%.3f" % aas[-1], "%.3f..%.3f" % (min(ratio), max(ratio))]
        L.append(row)
    summary = "overall (geometric mean of the %d cells) %.3f, A/A %.3f; " % (len(cells), gmean(cells), gmean(aas)) + (
        "every cell >= 0.98" if min(cells) >= 0.98 else "lowest cell %.3f" % min(cells))
    fill(template or out, out, {"day": day, "cycles": len(runs), "rounds": rounds, "transport": transport,
                                "ncpu": ncpu, "load": load, "summary": summary, "kernel": kernel, "table": md(
        "prompt tokens | pull GB/s, host woken by the fd: off | on | ratio | A/A | ratio over cycles | pull GB/s, "
        "host stepping: off | on | ratio | A/A | ratio over cycles | push: after last layer ms: off | on | ratio | "
        "A/A | ratio over cycles", "l" * 16, L)})
    print(open(out).read())


def adapter(res, repeats, requests, kv_mib, out=""):
    """run_adapter.sh's tables on stdout, its JSON in OUT when given (RES REPEATS REQUESTS KV_MIB [OUT])"""
    ncpu, kernel, day, load = hostinfo()
    runs = {}  # (transport, mode, host) -> [run's json]
    for f, j in jsons(res, "hand-*.json"):
        host, t, m = os.path.basename(f).split("-")[1:4]
        runs.setdefault((t, m, host), []).append(j)
    rows = []
    for (t, m) in sorted({(t, m) for t, m, _ in runs}, key=lambda x: (x[0], x[1] != "pull")):
        hosts = (("c", runs[(t, m, "c")]), ("py", runs[(t, m, "py")]))
        r = {"transport": t, "mode": m, "runs": len(hosts[0][1])}
        for name, runs_name, key in (("gbs", "gbs_runs", "gb_per_s"), ("handoff_ms_p50", "handoff_p50_runs",
                                     "handoff_ms_p50"), ("hgbs", "hgbs_runs", "handoff_gb_per_s")):
            r.update({f"{h}_{name}": statistics.median(j[key] for j in js) for h, js in hosts})
            r.update({f"{h}_{runs_name}": [j[key] for j in js] for h, js in hosts})
        r["all_verified"] = all(j["pass"] for _, js in hosts for j in js)
        r["ratio"] = r["py_gbs"] / r["c_gbs"] if r["c_gbs"] else 0.0  # over the wall: each host's own work in it
        r["handoff_ratio"] = r["py_hgbs"] / r["c_hgbs"] if r["c_hgbs"] else 0.0
        rows.append(r)
    steps = [{"mode": j["mode"], "side": side, "layers": j["layers"], "concurrency": j["concurrency"],
              "all": {k: v for k, v in s.items() if k != "at_full"}, "at_64": s["at_full"]}
             for _, j in jsons(res, "step-*.json") for side in ("prefill", "decode")
             for s in [j["connector_step_us"][side]] if s]
    pulls = [r for r in rows if r["mode"] == "pull"]
    goal = pm(pulls and all(r["handoff_ratio"] >= 0.95 for r in pulls))
    # "TRANSPORT MODE WHAT" of every row in RS, joined by JOIN
    each = lambda what, join="; ", rs=rows: join.join("%s %s %s" % (r["transport"], r["mode"], what(r)) for r in rs)
    spread = lambda k: each(lambda r: "%.2f-%.2f" % (min(r[k]), max(r[k])))
    print("# Hand-offs through the Python adapter against the C mock host\n\n"
          "run_adapter.sh on %s (%s CPUs, %s, load average %s): llama8b-like shape (32 layers, 8 KV heads x 128 x"
          " 2 B, 16-token blocks), packed layout, KV in the host's memory (%s MiB per instance), %s requests of 4096"
          " tokens, concurrency 4; medians of %s runs per host, interleaved. Hand-off = prefill's last layer saved"
          " to decode holding the KV; over the hand-offs = the verified KV over the time at least one hand-off was under"
          " way (the same interval on both hosts, without their own fill and check); over the wall = verified KV /"
          " wall from the first request (each host's own work in it).\n" %
          (day, ncpu, kernel, load, kv_mib, requests, repeats))
    print(tab("transport | mode | C: GB/s over the hand-offs | adapter: GB/s over the hand-offs | adapter / C"
              " | C hand-off p50 ms | adapter hand-off p50 ms | C GB/s over the wall | adapter GB/s over the wall"
              " | every request verified", "l" * 10, "{transport} | {mode} | {c_hgbs:.2f} | {py_hgbs:.2f} | "
              "{handoff_ratio:.2f}x | {c_handoff_ms_p50:.1f} | {py_handoff_ms_p50:.1f} | {c_gbs:.2f} | "
              "{py_gbs:.2f} | {ok}", [dict(r, ok="yes" if r["all_verified"] else "NO") for r in rows]) + "\n")
    print("- adapter / C, GB/s over the hand-offs, 4096-token requests, pull (the whole transfer inside the"
          " hand-off): %s (goal >= 0.95x): %s" %
          (", ".join("%s %.2fx" % (r["transport"], r["handoff_ratio"]) for r in pulls), goal))
    print("- push: most layers move while prefill still computes, so its hand-off holds only what is left after the"
          " last layer; compare its hand-off p50 (its GB/s over the hand-offs counts the whole request's bytes over"
          " that tail, and is not a transfer rate)")
    print("- spread over the %s runs (min-max): GB/s over the hand-offs, C: %s; adapter: %s; hand-off p50 ms, C: %s;"
          " adapter: %s" % (repeats, spread("c_hgbs_runs"), spread("py_hgbs_runs"), spread("c_handoff_p50_runs"),
                            spread("py_handoff_p50_runs")))
    print("- hand-off p50, C / adapter (above 1: the adapter's is shorter): %s" %
          each(lambda r: "%.2fx" % (r["c_handoff_ms_p50"] / r["py_handoff_ms_p50"]), ", ",
               [r for r in rows if r["py_handoff_ms_p50"]]))
    print("- over the wall, adapter / C: %s. The hosts' own work per byte differs: the C host computes every 8 bytes"
          " of KV with a mix64 hash and checks them the same way; the Python host copies a window of a random table"
          " into the blocks and compares bytes with torch.equal (int64 views); that ratio holds that difference, not"
          " the adapter's cost." % each(lambda r: "%.2fx" % r["ratio"], ", "))
    print("- runs' GB/s over the wall, C: %s; adapter: %s\n" %
          tuple(each(lambda r: " ".join("%.2f" % g for g in r[k])) for k in ("c_gbs_runs", "py_gbs_runs")))
    print("## Python overhead per step\n\n"
          "hixl-py-host, %s layers of tiny blocks (2 KV heads x 16, 4-token blocks), concurrency 64, tcp: the time"
          " each step spends in the connector's hooks (time.perf_counter_ns around each call: the adapter, ctypes and"
          " the plugin's C; push mode's worker hooks also wait for the push), over the steps with requests in flight.\n"
          % (steps[0]["layers"] if steps else "?"))
    cell = lambda f, k: "%.0f, %.0f | %.0f" % (f[k + "_us"], f[k + "_c_us"], f[k + "_cpu_us"] - f[k + "_c_cpu_us"])
    print(md("mode | side | steps | requests in flight | scheduler step: us, of it in C | its Python, CPU us"
             " | worker step: us, of it in C | its Python, CPU us", "l" * 8,
             [[s["mode"], s["side"], f["steps"], what, cell(f, "scheduler"), cell(f, "worker")] for s in steps
              for what, f in (("64", s["at_64"]), ("any, mean %.1f" % s["all"]["inflight_mean"], s["all"])) if f]) + "\n")
    print("*us*: wall time in the hooks (time.perf_counter_ns), *in C*: inside the plugin's ops (ctypes' marshalling"
          " included); *its Python, CPU us*: the hooks' CPU time outside the plugin's ops (time.thread_time_ns: the"
          " adapter's own work and this driver's timing wrappers, and not inflated when the machine takes the CPU"
          " away mid-hook).\n")
    astep = json.load(open(os.path.join(res, "adapter-step.json")))
    print("## The adapter's CPU per step, 64 requests in flight\n\n"
          "integration/bench/adapter_step.py: the hooks through hixl_vllm into the plugin without a peer (no KV moves),"
          " 64 requests of %d blocks, %d layers; this thread's CPU time (time.thread_time_ns), median of %d steps.\n" %
          (astep["blocks_per_request"], astep["layers"], astep["steps"]))
    print(md("step | CPU us | of it in the plugin's C ops | Python | per request", "lllll", [
        "%s | %.0f | %.0f | %.0f | %s" % (k, x["us"], x["c_us"], x["us"] - x["c_us"],
                                          "-" if k == "worker" else "%.1f" % (x["us"] / 64))
        for k, x in astep["per_step"].items()]))
    if out:
        json.dump({"date": day, "cpus": int(ncpu), "kernel": kernel, "load": load, "requests": int(requests),
                   "repeats": int(repeats), "kv_mib": int(kv_mib), "prompt_tokens": 4096, "rows": rows,
                   "step_overhead": steps, "adapter_step": astep, "goal_metric": "pull: GB/s over the hand-offs",
                   "goal_ratio_ge_0_95": goal}, open(out, "w"), indent=1)
        print("run_adapter: wrote %s" % out, file=sys.stderr)


def ab(raw, out):
    """ab.sh's OUT/ab.md and OUT/ab.json from its raw runs (RAW OUT; the AB_* environment)"""
    E = os.environ
    pts, grp = {}, {}  # (t, batch, op[, block]) -> {"old": {round: value}, "new": ...}
    for path, j in jsons(raw, "r*.json"):
        r, who, t, b, op = re.match(r".*/r(\d+)-(old|new)-(\w+)-b(\d+)-(\w+)\.json$", path).groups()
        g = grp.setdefault((t, int(b), op.upper()), {"old": {}, "new": {}})
        g[who][int(r)] = cpu_seconds(path) / (sum(p["bytes"] for p in j["results"]) / 2**30)
        for p in j["results"]:
            pts.setdefault((t, p["batch"], p["op"], p["block_size"]), {"old": {}, "new": {}})[who][int(r)] = p["gbps"]

    def summary(d):
        o, n = list(d["old"].values()), list(d["new"].values())
        mo, mn = statistics.median(o), statistics.median(n)
        aa = max(o) / min(o) if len(o) > 1 and min(o) > 0 else None
        return {"old": mo, "new": mn, "ratio": mn / mo if mo > 0 else None, "aa": aa, "old_rounds": o, "new_rounds": n}

    n = int(E["AB_ROUNDS"])
    lines = [f"# A/B: hixl-bench, OLD vs NEW\n\n- OLD: {E['AB_OLD']}\n- NEW: {E['AB_NEW']}",
             f"- {n} round{'s' * (n > 1)} interleaved (OLD first in odd rounds), {E['AB_SECS']} s a point, "
             f"StagingThreshold=0, --pin 0,1; {E['AB_ELAPSED']} s; load average {E['AB_LOAD']}",
             "- GB/s: median over rounds. A/A: OLD's max/min over its rounds (n/a with one round). "
             "REGRESSION?: NEW/OLD < 0.9 and below 1/A/A; with one round, below 0.9 says no more than that.\n"]
    jp, L, unsure = [], [], 0
    for k in sorted(pts):
        s = summary(pts[k])
        low = s["ratio"] is not None and s["ratio"] < 0.9
        bad = low and s["aa"] is not None and s["ratio"] < 1 / s["aa"]
        unsure += low and s["aa"] is None
        flag = "REGRESSION?" if bad else "below 0.9, no A/A" if low and s["aa"] is None else ""
        L.append([*k[:3], sz(k[3]), f"{s['old']:.2f}", f"{s['new']:.2f}", x2(s["ratio"]), x2(s["aa"]), flag])
        jp.append(dict(transport=k[0], batch=k[1], op=k[2], block_size=k[3], gbps=s, regression=bool(bad)))
    lines.append(md("transport | batch | op | block | OLD GB/s | NEW GB/s | NEW/OLD | A/A | REGRESSION?", "lrlrrrrrl", L))
    lines.append("\nCPU seconds (user + system, initiator and target, whole run) per GiB measured, per group; "
                 "MORE CPU?: NEW/OLD > 1.1 and above A/A.\n")
    jg, L = [], []
    for k in sorted(grp):
        s = summary(grp[k])
        bad = s["ratio"] is not None and s["ratio"] > 1.1 and s["aa"] is not None and s["ratio"] > s["aa"]
        L.append([*k, f"{s['old']:.3f}", f"{s['new']:.3f}", x2(s["ratio"]), x2(s["aa"]), "MORE CPU?" if bad else ""])
        jg.append(dict(transport=k[0], batch=k[1], op=k[2], cpu_s_per_gib=s, more_cpu=bool(bad)))
    lines.append(md("transport | batch | op | OLD s/GiB | NEW s/GiB | NEW/OLD | A/A | MORE CPU?", "lrlrrrrl", L))
    rs, aas = ([p["gbps"][k] for p in jp if p["gbps"][k]] for k in ("ratio", "aa"))
    lines.append(f"\nNEW/OLD GB/s {span(rs)} over {len(jp)} points"
                 + (f", A/A {span(aas)}" if aas else ", no A/A (one round)")
                 + f"; {sum(p['regression'] for p in jp)} flagged REGRESSION?, "
                 f"{sum(g['more_cpu'] for g in jg)} groups MORE CPU?"
                 + (f", {unsure} points below 0.9 with no A/A to judge them by." if unsure else "."))
    text = "\n".join(lines) + "\n"
    open(f"{out}/ab.md", "w").write(text)
    json.dump(dict(meta={k[3:].lower(): v for k, v in E.items() if k.startswith("AB_")}, points=jp, groups=jg),
              open(f"{out}/ab.json", "w"), indent=1)
    sys.stdout.write(text)


def auth(res, out, template=None):
    """docs/performance-auth.md and RES/auth.json from run_auth.sh's results (RES OUT [TEMPLATE]; the AUTH_*
    environment), into the blocks of TEMPLATE (default: OUT, the page itself)."""
    E, med = os.environ, statistics.median
    GOAL, NOISE = 0.95, 0.05
    # ops[(t, op)][variant][round] = GB/s; pd[t][variant][round] = {gbs, p50, p99}; conn[t][variant][round] = its row;
    # cpu[(kind, t)][variant][round] = CPU seconds per GiB moved (ops: READ and WRITE of one run together)
    ops, pd, conn, cpu = (collections.defaultdict(lambda: collections.defaultdict(dict)) for _ in range(4))
    rounds = set()
    for p, j in jsons(res, "raw", "r*-*.json"):  # the JSON keys in one order
        m = re.match(r"r(\d+)-(?:(ops|pd)-(\w+)-(onp|on|off|offb)|conn)\.json$", os.path.basename(p))
        if not m:
            continue
        r, kind, t, v = int(m[1]), m[2], m[3], m[4]
        if not kind:  # the connects
            for x in j["results"]:
                conn[x["transport"]][x["mode"].replace("-", "")][r] = x
            continue
        rounds.add(r)
        if kind == "ops":
            for x in j["results"]:
                ops[t, x["op"]][v][r] = x["gbps"]
        moved = sum(x.get("bytes", 0) for x in j["results"]) if kind == "ops" else j.get("kv_bytes_verified", 0)
        c = cpu_seconds(p)
        if c is not None and moved > 0:
            cpu[kind, t][v][r] = c / (moved / 2**30)
        if kind == "pd":
            if not j.get("pass"):
                sys.exit(f"run_auth: {p}: the mock host's run did not pass")
            pd[t][v][r] = {"gbs": j["gb_per_s"], "p50": j["handoff_ms_p50"], "p99": j["handoff_ms_p99"]}
    rounds = sorted(rounds)
    n = len(rounds)

    by = lambda d, key: {w: {r: x[key] for r, x in rs.items()} for w, rs in d.items()}  # each round's figure KEY
    pair = lambda d, a, b: [d[a][r] / d[b][r] for r in rounds if r in d.get(a, ()) and d.get(b, {}).get(r, 0) > 0]

    def pooled(d):
        """median(on) / median(every keyless run, off and off-b): twice the reference runs."""
        on, offs = list(d.get("on", {}).values()), [x for w in ("off", "offb") for x in d.get(w, {}).values()]
        return med(on) / med(offs) if on and offs and med(offs) > 0 else None

    spread = lambda v: {"min": min(v), "median": med(v), "max": max(v)} if v else None
    # A/B on/off, A/A off-b/off and A/B on+tag/off, each over the rounds
    abaa = lambda d: [spread(pair(d, a, "off")) for a in ("on", "offb", "onp")]
    meds = lambda d: {k: med(d[k].values()) for k in d}  # each variant's median
    fp = lambda x: "n/a" if x is None else f"{x:.3f}"
    fx = lambda s: "n/a" if s is None else f"{s['min']:.3f} / **{s['median']:.3f}** / {s['max']:.3f}"
    aa_width = lambda s: None if s is None else max(abs(s["max"] - 1), abs(1 - s["min"]))  # from 1, either way
    # The medians of on, off and off-b, as FORMAT, joined by JOIN.
    three = lambda g, form, join=" | ": join.join(format(g.get(w, 0), form) for w in ("on", "off", "offb"))

    def verdict(ab, aa):  # PASS or MISS, and why the A/A makes it unsure
        if ab is None:
            return "n/a", ""
        w, notes = aa_width(aa), []
        if ab["median"] < GOAL and aa is not None and aa["min"] <= ab["median"]:
            notes.append("the A/A ratio went as low in these rounds: not told apart from noise")
        if w is not None and w > NOISE:
            notes.append(f"A/A strays {w * 100:.1f}% from 1, more than the 5% the goal resolves")
        return pm(ab["median"] >= GOAL), "; ".join(notes)

    cap = ("**included**: the plugin's KV service checks a per-request capability (`cap_check` in "
           "`plugin/src/kv_service.c`, `kv_cap_make` in the built plugin)") if E["AUTH_CAP_BIN"] == "yes" else \
          "**not included**: the built plugin has no per-request capability check (no `kv_cap_make`)"
    if E["AUTH_CAP_SRC"] != E["AUTH_CAP_BIN"]:
        cap += f" (the source at report time: {'has' if E['AUTH_CAP_SRC'] == 'yes' else 'has no'} `cap_check`)"
    elapsed, load = read(os.path.join(res, "elapsed"), None), read(os.path.join(res, "load"), None)
    if None in (elapsed, load):
        elapsed, load = "?", "?"
    notes = [f"- Note: {x}." for x in sorted(set(read(os.path.join(res, "notes")).splitlines()))]
    if not any("ci.lock" in x for x in notes):
        notes.append("- `/tmp/ci.lock` was not seen before any run of the measurement.")
    v = {"measured": read(os.path.join(res, "date"), "?"), "written": E["AUTH_DATE"],
         "machine": f"{E['AUTH_CPU']}, {E['AUTH_NCPU']} CPUs, Linux {E['AUTH_KERNEL']}",
         "tree": f"HEAD {read(os.path.join(res, 'head'), '?')} when the measurement started, {E['AUTH_HEAD']} with "
                 f"{E['AUTH_DIRTY']} uncommitted changed files when this page was written ({E['AUTH_WHERE'] or 'none'}); "
                 f"binaries in `{E['AUTH_BUILD']}` built {E['AUTH_BUILT']}",
         "cap": cap, "notes": "\n".join(notes), "secs": E["AUTH_SECS"], "requests": E["AUTH_REQUESTS_N"],
         "load": f"{n} rounds, {elapsed} s of measurement; load average (1, 5, 15 min) "
                 + "; ".join(l.strip() for l in load.splitlines()), "connects": E["AUTH_CONNECTS_N"]}
    J = {"meta": {k[5:].lower(): v for k, v in E.items() if k.startswith("AUTH_")}, "rounds": rounds,
         "ops": [], "pd": [], "connect": [], "goals": {}}
    J["meta"]["capability_check_in_plugin"] = E["AUTH_CAP_BIN"] == "yes"
    OPS = sorted(ops, key=lambda k: (k[0] != "tcp", k[1] != "WRITE"))
    PD = sorted(pd, key=lambda k: k != "tcp")

    L = []
    for (t, op) in OPS:
        d = ops[(t, op)]
        (ab, aa, abp), g, pl = abaa(d), meds(d), pooled(d)
        vd, why = verdict(ab, aa)
        L.append(f"{t} | {op} | {three(g, '.2f')} | {fx(ab)} | {fx(aa)} | {fp(pl)} | "
                 f"**{vd}**{': ' + why if why else ''} | {g.get('onp', 0):.2f} | {fx(abp)}")
        J["ops"].append({"transport": t, "op": op, "gbps_median": g, "gbps_rounds": d, "ab": ab, "aa": aa,
                         "on_over_all_keyless": pl, "verdict": vd, "note": why})
    v["ops"] = md("transport | op | on GB/s | off GB/s | off-b GB/s | A/B on/off (min / **med** / max) | A/A off-b/off | "
                  "on / all keyless | verdict (>= 0.95x) | on + AuthPayloadTag GB/s | its A/B on+tag/off",
                  "llrrrllrlrl", L)
    L = []
    for t in PD:
        d = pd[t]
        gd, ld = by(d, "gbs"), by(d, "p50")
        (ab, aa, abp), (lab, laa, _), g, l, pl = abaa(gd), abaa(ld), meds(gd), meds(ld), pooled(gd)
        vd, why = verdict(ab, aa)
        L.append(f"{t} | {three(g, '.3f')} | {fx(ab)} | {fx(aa)} | {fp(pl)} | "
                 f"**{vd}**{': ' + why if why else ''} | {three(l, '.1f', ' / ')} | {fx(lab)} | {fx(laa)} | "
                 f"{g.get('onp', 0):.3f} | {fx(abp)}")
        J["pd"].append({"transport": t, "gbps_median": g, "handoff_p50_ms_median": l, "rounds": d, "ab_gbps": ab,
                        "aa_gbps": aa, "on_over_all_keyless_gbps": pl, "ab_handoff_p50": lab,
                        "aa_handoff_p50": laa, "verdict": vd, "note": why})
    v["pd"] = md("transport | on GB/s | off GB/s | off-b GB/s | A/B GB/s on/off | A/A GB/s off-b/off | GB/s on / all "
                 "keyless | verdict (>= 0.95x) | hand-off p50 ms on / off / off-b | A/B p50 on/off | A/A p50 off-b/off | "
                 "on + AuthPayloadTag GB/s | its A/B", "lrrrllrllllrl", L)
    L, J["cpu_s_per_gib"] = [], []
    for (kind, t), d in sorted(cpu.items(), key=lambda kd: (kd[0][0] != "ops", kd[0][1] != "tcp")):
        (ab, aa, abp), g = abaa(d), meds(d)
        L.append(f"{'4 MiB ops' if kind == 'ops' else 'P/D hand-off'} | {t} | {three(g, '.3f')} | {fx(ab)} | "
                 f"{fx(aa)} | {g.get('onp', 0):.3f} | {fx(abp)}")
        J["cpu_s_per_gib"].append({"kind": kind, "transport": t, "median": g, "rounds": d, "ab": ab, "aa": aa})
    v["cpu"] = md("case | transport | on s/GiB | off s/GiB | off-b s/GiB | A/B on/off (min / **med** / max) | A/A "
                  "off-b/off | on + AuthPayloadTag s/GiB | its A/B", "llrrrllrl", L)

    # hixl-auth-bench --frames' table below its first line; a file missing or with no table: not measured
    v["frames"] = read(os.path.join(res, "frames.out")).partition("\n")[2].strip() or "(not measured in this run)"

    L = []
    for t, d in sorted(conn.items(), key=lambda td: td[0] != "tcp"):
        m3 = lambda key: " / ".join(f"{med(x[key] for x in d[w].values()):.0f}" for w in ("on", "off", "offb") if w in d)
        added = med(d["on"][r]["p50_us"] - d["off"][r]["p50_us"] for r in rounds if r in d["on"] and r in d["off"])
        s = {f"{name}_{key[:-3]}": spread(pair(by(d, key), a, "off")) for key in ("p50_us", "mean_us")
             for name, a in (("ab", "on"), ("aa", "offb"))}  # ab_p50 aa_p50 ab_mean aa_mean
        L.append(f"{t} | {m3('p50_us')} | {m3('p99_us')} | {m3('mean_us')} | {added:.0f} | "
                 + " | ".join(map(fx, s.values())))
        J["connect"].append({"transport": t, "rounds": d, "added_p50_us": added, **s})
    v["connect"] = md("transport | p50 us on / off / off-b | p99 us on / off / off-b | mean us on / off / off-b | "
                      "added p50 us | A/B p50 on/off | A/A p50 off-b/off | A/B mean on/off | A/A mean off-b/off",
                      "llllrllll", L)
    VARIANTS = {"onp": "on + AuthPayloadTag", "on": "on", "off": "off", "offb": "off-b"}
    L = [[f"4 MiB {op} {t}", name] + [f"{d[r]:.2f}" if r in d else "-" for r in rounds]
         for t, op in OPS for w, name in VARIANTS.items() for d in [ops[(t, op)].get(w, {})]]
    L += [[f"P/D {t}", name] + [f"{d[r]['gbs']:.3f} ({d[r]['p50']:.0f} ms)" if r in d else "-" for r in rounds]
          for t in PD for w, name in VARIANTS.items() for d in [pd[t].get(w, {})]]
    v["rounds"] = md("case | variant | " + " | ".join(f"round {r}" for r in rounds), "ll" + "r" * n, L)

    v["goal_ops"], v["goal_pd"] = (pm(all(x["verdict"] == "PASS" for x in J[k])) for k in ("ops", "pd"))
    J["goals"] = {"ops_4mib_on_off_ge_0.95": v["goal_ops"], "pd_on_off_ge_0.95": v["goal_pd"]}
    wide = [f"ops {x['transport']} {x['op']}" for x in J["ops"] if (aa_width(x["aa"]) or 0) > NOISE] + \
           [f"P/D {x['transport']}" for x in J["pd"] if (aa_width(x["aa_gbps"]) or 0) > NOISE]
    v["noise"] = (f"the A/A ratio strayed more than 5% from 1 for {', '.join(wide)}. There the machine's run-to-run "
                  "spread is as large as or larger than the effect the goal bounds; a PASS says the median A/B ratio "
                  "met the bound, not that a 5% loss is ruled out, and a MISS within the A/A range is not a measured "
                  "loss." if wide else "every A/A ratio stayed within 5% of 1.")
    fill(template or out, out, v)
    json.dump(J, open(os.path.join(res, "auth.json"), "w"), indent=1)
    sys.stdout.write(open(out).read())


def layouts(res, out, rounds, template=None):
    """docs/performance-layouts.md and RES/pd-layouts.json from run_pd.sh's layout runs (RES OUT ROUNDS
    [TEMPLATE]), into the blocks of TEMPLATE (default: OUT, the page itself)."""
    ncpu, kernel, day, load = hostinfo()
    runs = {}  # (transport, layout, block tokens) -> [run's json]
    for _, j in jsons(res, "layouts-*.json"):
        runs.setdefault((j["transport"], j["layout"], j["block_tokens"]), []).append(j)
    LAYOUTS, BLOCK_MAJOR = ["kv_first", "BLNHC", "cross_layer"], ["BLNHC", "cross_layer"]
    NAMES = {"tcp": "tcp", "auto": "shm (Transport auto between two processes of one host)"}
    rows, aa_runs = [], []
    for (t, lay, bt), js in runs.items():
        for rs in zip(*(j["rows"] for j in js)):  # a row in every run
            if len({(r["plugin_engine_ops"], r["engine_ops"], r["runs"]) for r in rs}) != 1:
                print("run_pd: %s %s %d-token blocks, %d tokens: op counts differ between runs" %
                      (t, lay, bt, rs[0]["tokens"]), file=sys.stderr)
            aa_runs += [r["aa_ratio"] for r in rs]
            row = {"transport": t, "layout": lay, "block_tokens": bt,
                   **{k: rs[0][k] for k in ("tokens", "blocks", "bytes", "runs")},
                   "plugin_engine_ops": max(r["plugin_engine_ops"] for r in rs), "engine_ops": rs[0]["engine_ops"],
                   "repeats": len(rs), "rounds": sum(r["rounds"] for r in rs),
                   **{k: statistics.median(r[k] for r in rs) for k in ("plugin_fd_gbs", "raw_gbs", "raw2_gbs")}}
            rows.append(dict(row, ratio=row["plugin_fd_gbs"] / row["raw_gbs"], aa_ratio=row["raw2_gbs"] / row["raw_gbs"]))
    rows.sort(key=lambda r: (r["transport"] != "tcp", LAYOUTS.index(r["layout"]), r["block_tokens"], r["tokens"]))
    transports = [t for t in ("tcp", "auto") if any(r["transport"] == t for r in rows)]
    find = {(r["transport"], r["layout"], r["block_tokens"], r["tokens"]): r for r in rows[::-1]}.get  # first match
    longest = max(r["tokens"] for r in rows)

    # Goal 1: block-major layouts, the longest request: engine ops <= runs of adjacent blocks.
    g1 = [r for r in rows if r["layout"] in BLOCK_MAJOR and r["tokens"] == longest]
    g1_pass = bool(g1) and all(r["plugin_engine_ops"] <= r["runs"] for r in g1)
    # Goal 2: 16-token blocks at >= 0.9x 64-token blocks' throughput, the same bytes.
    g2 = [{"transport": t, "layout": lay, "tokens": tok, "judged": lay in BLOCK_MAJOR,
           "plugin": a["plugin_fd_gbs"] / b["plugin_fd_gbs"], "raw": a["raw_gbs"] / b["raw_gbs"]}
          for t in transports for lay in LAYOUTS for tok in sorted({r["tokens"] for r in rows})
          for a, b in [(find((t, lay, 16, tok)), find((t, lay, 64, tok)))] if a and b]
    judged = [g for g in g2 if g["judged"]]
    g2_pass = bool(judged) and all(g["plugin"] >= 0.9 for g in judged)

    json.dump({"date": day, "cpus": int(ncpu), "kernel": kernel, "rounds": int(rounds), "rows": rows,
               "block_tokens_ratio": g2, "goals": {"ops_le_runs": pm(g1_pass), "16_over_64": pm(g2_pass)}},
              open(os.path.join(res, "pd-layouts.json"), "w"), indent=1)

    reps = max(r["repeats"] for r in rows)
    L = []
    for t in transports:  # its table, then its verdicts
        L += ["## %s" % NAMES[t], "", tab(
            "layout | block tokens | prompt tokens | runs of adjacent blocks | plugin engine ops per request | raw "
            "engine ops | plugin GB/s | raw engine GB/s | ratio | A/A", "l" * 10, "{layout} | {block_tokens} | {tokens}"
            " | {runs} | {plugin_engine_ops} | {engine_ops} | {plugin_fd_gbs:.2f} | {raw_gbs:.2f} | {ratio:.2f} | "
            "{aa_ratio:.2f}", [r for r in rows if r["transport"] == t]), ""]
        mine = [r for r in g1 if r["transport"] == t]
        kv = {r["block_tokens"]: r["plugin_engine_ops"] for r in rows
              if r["transport"] == t and r["layout"] == "kv_first" and r["tokens"] == longest}
        L.append("- engine ops per %d-token request, block-major layouts, <= its runs of adjacent blocks: %s (%s)" %
                 (longest, pm(mine and all(r["plugin_engine_ops"] <= r["runs"] for r in mine)),
                  "; ".join("%s %d-token blocks: %d ops for %d runs (kv_first: %s)" % (
                      r["layout"], r["block_tokens"], r["plugin_engine_ops"], r["runs"], kv.get(r["block_tokens"], "-"))
                      for r in mine)))
        mine = [g for g in judged if g["transport"] == t]
        miss = [g for g in mine if g["plugin"] < 0.9]
        L.append("- 16-token blocks / 64-token blocks, plugin pull GB/s, the same bytes, block-major layouts:"
                 " %s (goal >= 0.9): %s" % (span([g["plugin"] for g in mine]), "PASS" if not miss else
                  "MISS at %s" % ", ".join("%s %d tokens (%.2fx; the raw engine's: %.2fx)" %
                                           (g["layout"], g["tokens"], g["plugin"], g["raw"]) for g in miss))
                 if mine else "- no pairs measured: MISS")
        for lay, ps in [(lay, [g for g in g2 if g["transport"] == t and g["layout"] == lay]) for lay in LAYOUTS]:
            L += ["- %s, 16 / 64-token blocks by prompt (%s tokens): plugin %s; raw engine %s" % (
                lay, ", ".join(str(g["tokens"]) for g in ps), ", ".join("%.2fx" % g["plugin"] for g in ps),
                ", ".join("%.2fx" % g["raw"] for g in ps))] if ps else []
        L += ["- the raw engine against itself in the same rounds (A/A, the noise of the ratios): %s" %
              span([r["aa_ratio"] for r in rows if r["transport"] == t]), ""]
    fill(template or out, out, {
        "run": "%s (%s CPUs, %s)" % (day, ncpu, kernel), "times": "%d time%s" % (reps, "" if reps == 1 else "s"),
        "rounds": "%s round%s" % (rounds, "" if rounds == "1" else "s"), "ncpu": ncpu, "load": load,
        "aa": span(aa_runs), "longest": longest, "goal_ops": pm(g1_pass), "goal_bt": pm(g2_pass),
        "goal_bt_min": " (min %.2fx)" % min(g["plugin"] for g in judged) if judged else "", "tables": "\n".join(L)})
    print("run_pd: wrote %s and %s" % (out, os.path.join(res, "pd-layouts.json")), file=sys.stderr)


def pd(res, out, template, rounds, step_us, rdma_rounds):
    """docs/performance-pd.md from run_pd.sh's RES (pd-TRANSPORT.md and .json; rdma unless
    RDMA_ROUNDS is -), into the blocks of TEMPLATE (the page itself)."""
    v = {"run": "on " + run_on(), "rounds": rounds, "step_us": step_us, "rdma_rounds": rdma_rounds}
    for t in ("tcp", "auto", "rdma"):
        page = None if t == "rdma" and rdma_rounds == "-" else read(os.path.join(res, f"pd-{t}.md"), None)
        v[t] = (page + "\n\n" + pd_verdict(os.path.join(res, f"pd-{t}.json"))) if page else "(not measured in this run)"
    fill(template, out, v)


def pd_verdict(path):
    """run_pd.sh's verdicts of one hixl-pd-bench JSON: PASS/MISS per goal, over the rows, a bullet each."""
    L = []
    P = lambda s: L.append("- " + s)
    rows = json.load(open(path))["rows"]
    if any("cpu_ratio_host" not in r for r in rows):
        sys.exit(f"report.py: {path}: not the columns of today's hixl-pd-bench (no cpu_ratio_host): run it again")
    col = lambda k: span([r[k] for r in rows])  # K's span over the rows
    # PASS, or MISS at the rows where BAD holds
    miss_at = lambda bad: "MISS at %s tokens" % ", ".join(str(r["tokens"]) for r in rows if bad(r)) \
        if any(bad(r) for r in rows) else "PASS"
    # The goals are issue 47's: pull >= 0.95x, push <= 1.25x or within 0.05x of its floor, CPU <= 1.1x.
    P("pull through the plugin / raw engine, host woken by the event fd: %s (goal >= 0.95): %s" %
      (col("ratio"), miss_at(lambda r: r["ratio"] < 0.95)))
    P("the raw engine against itself in the same rounds (A/A, the noise of these ratios): %s" % col("aa_ratio"))
    P("the fd-woken pull / the raw READ with both hosts stepping beside it, as they do during the pull (on"
      " decode's CPU, which its loader shares under --pin): %s (goal >= 0.95): %s" %
      (col("ratio_host"), miss_at(lambda r: r["ratio_host"] < 0.95)))
    P("the same pull, host stepping: %s (up to one host step more; not the goal's measure)" % col("ratio_stepping"))
    miss = [r for r in rows if r["push_ratio"] > 1.25 and r["push_ratio"] > r["push_floor"] + 0.05]
    P("push, after the last layer / one layer's transfer: %s (goal <= 1.25, or within 0.05 of the floor): %s" %
      (col("push_ratio"), "PASS" if not miss else "MISS at %s" %
       ", ".join("%d tokens (%.2fx; the floor there, one layer plus one notice round trip: %.2fx; the pusher"
                 " was %.2f ms behind at the last save; the raw engine's own push: %.2fx, with a call per"
                 " layer: %.2fx)" % tuple(r[k] for k in ("tokens", "push_ratio", "push_floor", "behind_ms",
                                                          "raw_push_ratio", "raw_call_push_ratio")) for r in miss)))
    # The like-for-like reference is the raw engine's push with a landed call per layer (the
    # plugin's protocol without the plugin); the one without calls polls its requests.
    ceil = [r for r in miss if r["raw_call_push_ratio"] >= r["push_ratio"] - 0.05]
    if ceil:
        P("where the push missed, the raw engine's own push with a call per layer was as slow (within 0.05x) at %s:"
          " the machine's ceiling in this run" % ", ".join("%d tokens" % r["tokens"] for r in ceil))
    P("the raw engine's own pipelined push, after the last layer / one layer: %s (it learns each layer landed by"
      " polling, 50 us apart, and from the answer, a one-way trip after decode holds it)" % col("raw_push_ratio"))
    P("the same with a landed call behind each layer, as the plugin's notice: %s" % col("raw_call_push_ratio"))
    # Issue 47's measure: like for like, the raw READ with both hosts stepping beside it, as
    # they do during the pull (a step's CPU grows with the pull's time, not its bytes).
    P("CPU seconds per GiB of both processes, the fd-woken pull through the plugin / the raw READ with both hosts"
      " stepping beside it: %s (goal <= 1.1): %s (%s)" %
      (col("cpu_ratio_host"), miss_at(lambda r: r["cpu_ratio_host"] > 1.1),
       ", ".join("%d tokens %.3f / %.3f s" % (r["tokens"], r["cpu_s_per_gib_plugin"], r["cpu_s_per_gib_raw_host"])
                 for r in rows)))
    P("the same pull / the bare raw READ, no host stepping beside it: %s (%s)" %
      (col("cpu_ratio"), ", ".join("%d tokens %.3f s" % (r["tokens"], r["cpu_s_per_gib_raw"]) for r in rows)))
    return "\n".join(L)


def pd_dat(path):
    """hixl-pd-bench's JSON rows as "tokens handoff_ms push_after_last_ms layer_ms", for gnuplot."""
    for r in json.load(open(path))["rows"]:
        print(r["tokens"], r["handoff_ms"], r["push_after_last_ms"], r["layer_ms"])


def tp(res, out, template, cpus, mla_layers, shown_res):
    """docs/performance-tp.md from run_tp.sh's RES (gqa.md, mla.md, mla-shared.md, tp.json: hixl-tp-bench's JSON lines,
    whose goal lines it writes), into the blocks of TEMPLATE (the page itself); SHOWN_RES: RES as the page names it."""
    text = read(os.path.join(res, "tp.json"))
    rows = [json.loads(l) for l in text.splitlines()]
    ratios = sorted(re.findall(r'"ratio": ([0-9.]*)', text), key=float)
    lo, hi = (ratios[0], ratios[-1]) if ratios else ("", "")
    ok = sum(1 for r in rows if round(r["bytes_moved_per_request"]) == r["bytes_needed_per_request"])
    goal = ("Goal: plugin >= 0.9x the raw engine for every pair: **%s** (ratios %s to %s);\n" %
            ("PASS" if ratios and float(lo) >= 0.9 else "FAIL", lo, hi) +
            "rows whose 95%% interval lies wholly below 0.9x (a gap the noise does not explain): %d;\n" %
            sum(1 for r in rows if r["ratio_ci95"][1] < 0.9) +
            "bytes moved = bytes needed (a replicated head read once): %d of %d rows." % (ok, len(rows)))
    fill(template, out, {"run": run_on(), "cpus": cpus, "mla_layers": mla_layers, "goal": goal,
                         "json": f"{shown_res}/tp.json", **{k: read(os.path.join(res, k.replace("_", "-") + ".md"))
                                                            for k in ("gqa", "mla", "mla_shared")}})


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])
