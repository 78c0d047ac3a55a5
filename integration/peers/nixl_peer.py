"""NIXL's side of integration/peers/run_peers.sh: its Python agent with the UCX backend,
driven with Mooncake transfer_engine_bench's knobs (threads, batch_size, block_size,
duration, operation) and throughput formula, as hixl-peers is.

NIXL has no C API in its wheels (no headers), so this is Python. A target and an
initiator exchange agent metadata through files in --dir:

  nixl_peer.py --mode=target --dir=D --buffer_size=N      (until D/done appears)
  nixl_peer.py --mode=initiator --dir=D --buffer_size=N --point --operation=read|write
               --threads=T --batch_size=B --block_size=S --duration=SECONDS [--verify]
  nixl_peer.py --mode=initiator --dir=D --buffer_size=N   (points from stdin, one a line:
               "read|write THREADS BATCH BLOCK SECONDS VERIFY(0|1)"; the agents stay up)

The initiator keeps T transfer requests of B descriptors each in flight (Mooncake's T
threads with one batch each; one Python thread posts and polls them, NIXL's progress
thread moves the data), op i of request t at offset S * (i * T + t) on both sides. The
clock runs from the first post until the requests in flight at the deadline are done;
throughput = completed requests x B x S / that time, in 10^9 bytes per second. Then,
outside the timed region, --verify writes a pattern through the same descriptors, reads
it back into zeroed memory and compares. One line on stdout:
  RESULT tool=nixl ... gbps=... verified_bytes=... cpu_s=...
(cpu_s: this process's CPU seconds from the point's start to its result line).
UCX's transports come from the environment (UCX_TLS), as for NIXL's users.
"""
import argparse
import os
import resource
import sys
import time

import numpy as np

from nixl._api import nixl_agent, nixl_agent_config  # noqa: E402  (after numpy, as NIXL's examples)


def wait_for(path, timeout=30.0):
    end = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > end:
            sys.exit(f"nixl_peer: {path} did not appear within {timeout:.0f} s")
        time.sleep(0.01)


def write_atomic(path, data):
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.rename(path + ".tmp", path)


def make_agent(name):
    return nixl_agent(name, nixl_agent_config(backends=["UCX"]))


def target(a):
    agent = make_agent("target")
    buf = np.zeros(a.buffer_size, dtype=np.uint8)
    addr = buf.ctypes.data
    agent.register_memory([(addr, a.buffer_size, 0, "")], "DRAM")
    write_atomic(os.path.join(a.dir, "target.addr"), f"{addr:x} {a.buffer_size}\n".encode())
    write_atomic(os.path.join(a.dir, "target.md"), agent.get_agent_metadata())
    wait_for(os.path.join(a.dir, "initiator.md"))
    with open(os.path.join(a.dir, "initiator.md"), "rb") as f:
        agent.add_remote_agent(f.read())
    done = os.path.join(a.dir, "done")
    while not os.path.exists(done):
        time.sleep(0.02)
    return 0


def post_all(agent, handles):
    for h in handles:
        if agent.transfer(h) == "ERR":
            sys.exit("nixl_peer: transfer posting failed")


def wait_all(agent, handles):
    for h in handles:
        while True:
            s = agent.check_xfer_state(h)
            if s == "DONE":
                break
            if s == "ERR":
                sys.exit("nixl_peer: transfer failed")


def initiator(a):
    wait_for(os.path.join(a.dir, "target.md"))
    with open(os.path.join(a.dir, "target.addr")) as f:
        raddr, rlen = (int(x, 16) for x in f.read().split())
    agent = make_agent("initiator")
    buf = np.zeros(a.buffer_size, dtype=np.uint8)  # calloc: pages fault in on first use
    laddr = buf.ctypes.data
    agent.register_memory([(laddr, a.buffer_size, 0, "")], "DRAM")
    with open(os.path.join(a.dir, "target.md"), "rb") as f:
        peer = agent.add_remote_agent(f.read())
    write_atomic(os.path.join(a.dir, "initiator.md"), agent.get_agent_metadata())
    print("READY", flush=True)
    rc = 0
    if a.point:
        rc = run_point(a, agent, peer, buf, laddr, raddr, rlen, a)
    else:  # one point per line on stdin: op threads batch block duration verify(0|1)
        for line in sys.stdin:
            f = line.split()
            if len(f) != 6:
                continue
            pt = argparse.Namespace(operation=f[0], threads=int(f[1]), batch_size=int(f[2]),
                                    block_size=int(f[3]), duration=float(f[4]), verify=f[5] == "1")
            rc |= run_point(a, agent, peer, buf, laddr, raddr, rlen, pt)
    write_atomic(os.path.join(a.dir, "done"), b"")
    return rc


def run_point(a, agent, peer, buf, laddr, raddr, rlen, pt):
    cpu0 = cpu_seconds()
    span = pt.block_size * pt.batch_size * pt.threads
    if span > min(a.buffer_size, rlen):
        print(f"RESULT tool=nixl error=span_{span}_over_buffer", flush=True)
        return 2

    def handles(op):
        out = []
        for t in range(pt.threads):
            offs = [pt.block_size * (i * pt.threads + t) for i in range(pt.batch_size)]
            local = agent.get_xfer_descs([(laddr + o, pt.block_size, 0) for o in offs], "DRAM")
            remote = agent.get_xfer_descs([(raddr + o, pt.block_size, 0) for o in offs], "DRAM")
            out.append(agent.initialize_xfer(op, local, remote, peer))
        return out

    op = pt.operation.upper()
    hs = handles(op)
    # The target loads our metadata a moment after we publish it: the first post retries.
    deadline = time.monotonic() + 30
    while True:
        try:
            post_all(agent, hs[:1])
            wait_all(agent, hs[:1])
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    completed = 0
    t0 = time.monotonic()
    stop = t0 + pt.duration
    inflight = list(hs)
    post_all(agent, inflight)
    while inflight:
        still = []
        over = time.monotonic() >= stop
        for h in inflight:
            s = agent.check_xfer_state(h)
            if s == "PROC":
                still.append(h)
            elif s == "DONE":
                completed += 1
                if not over:
                    if agent.transfer(h) == "ERR":
                        sys.exit("nixl_peer: transfer posting failed")
                    still.append(h)
            else:
                sys.exit("nixl_peer: transfer failed")
        inflight = still
    secs = time.monotonic() - t0
    nbytes = completed * pt.batch_size * pt.block_size

    checked = 0
    if pt.verify:
        view = buf[:span]
        want = np.random.default_rng(pt.block_size).integers(0, 256, span, dtype=np.uint8)
        view[:] = want
        w = hs if op == "WRITE" else handles("WRITE")
        post_all(agent, w)
        wait_all(agent, w)
        view[:] = 0
        r = hs if op == "READ" else handles("READ")
        post_all(agent, r)
        wait_all(agent, r)
        if np.array_equal(view, want):
            checked = span
        else:
            bad = int(np.argmax(view != want))
            print(f"nixl_peer: VERIFY FAILED at byte {bad} of {span}", file=sys.stderr)
        for h in (w if w is not hs else []) + (r if r is not hs else []):
            agent.release_xfer_handle(h)
    for h in hs:
        agent.release_xfer_handle(h)
    print(f"Test completed: duration {secs:.2f}, batch count {completed}, "
          f"throughput {nbytes / secs / 1e9:.2f} GB/s", file=sys.stderr)
    print(f"RESULT tool=nixl op={op} block={pt.block_size} batch={pt.batch_size} threads={pt.threads} "
          f"seconds={secs:.4f} batches={completed} bytes={nbytes} gbps={nbytes / secs / 1e9:.4f} "
          f"verified_bytes={checked} cpu_s={cpu_seconds() - cpu0:.3f}", flush=True)
    return 0 if (checked or not pt.verify) else 3


def cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["target", "initiator"], required=True)
    p.add_argument("--dir", required=True)
    p.add_argument("--operation", choices=["read", "write"], default="read")
    p.add_argument("--threads", type=int, default=12)
    p.add_argument("--batch_size", type=int, default=128)
    p.add_argument("--block_size", type=int, default=65536)
    p.add_argument("--buffer_size", type=int, default=1 << 30)
    p.add_argument("--duration", type=float, default=10)
    p.add_argument("--verify", action="store_true")
    p.add_argument("--point", action="store_true", help="run the one point the options give, then exit "
                   "(default: read points from stdin)")
    a = p.parse_args()
    return target(a) if a.mode == "target" else initiator(a)


if __name__ == "__main__":
    rc = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # NIXL 1.5.1's agent teardown crashes (SIGSEGV) at interpreter exit, after the
    # results are out: leave without running destructors.
    os._exit(rc)
