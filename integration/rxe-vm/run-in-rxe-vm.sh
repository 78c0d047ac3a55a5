#!/usr/bin/env bash
# run-in-rxe-vm.sh (hixl's copy of the workplace rxe-vm tool, so the project runs
# without ../shared): run a command inside a throw-away QEMU guest whose kernel
# has soft-RoCE (rdma_rxe), with an rxe device "rxe0" already configured.
#
# Why: the host kernel has no RDMA (CONFIG_INFINIBAND unset), so real verbs
# programs (libibverbs/librdmacm, RC QPs, RDMA WRITE/READ) cannot run on it.
# Debian's stock 6.1 kernel (linux-image-6.1.0-*-amd64; NOT the -cloud flavour,
# which lacks rdma_rxe and 9p) ships rdma_rxe as a module, so we boot that
# kernel in a small VM and reuse the HOST's userspace (rdma-core, perftest,
# glibc, your freshly built test binaries) inside it over virtio-9p.
#
# Usage:
#   run-in-rxe-vm.sh 'COMMAND ...'          # one string: run by bash (else sh)
#   run-in-rxe-vm.sh prog arg1 arg2 ...     # several words: run as given
# e.g.
#   run-in-rxe-vm.sh 'ibv_rc_pingpong -d rxe0 -g 1 & sleep 1; ibv_rc_pingpong -d rxe0 -g 1 127.0.0.1'
#
# What the command sees inside the guest:
#   /        the host's root filesystem (virtio-9p, read-only) under a tmpfs
#            overlay: writes succeed but are thrown away at power-off
#   $RXE_VM_RW_DIR (default: the current directory, unless that is /) is ALSO shared read-write
#            at the same path, so files written there (reports, logs, build
#            outputs) land on the host. The command starts in the current dir.
#   /lib/modules/<guest kernel>  the guest kernel's modules (auto-loading and
#            `modprobe` work, e.g. veth, sch_*, ...)
#   rxe0     soft-RoCE device on dummy netdev "rxenet0", IPv4 10.77.0.1/24.
#            GID index 0 = fe80::… (from the MAC), index 1 = ::ffff:10.77.0.1
#            (both RoCE v2). Use "-g 1" with ibv_*_pingpong / "-x 1" with
#            perftest, and 10.77.0.1 with librdmacm tools (rping -a 10.77.0.1).
#            The VM has NO network card (-nic none): no packet ever leaves it.
#   uid 0, "ulimit -l unlimited"; env RXE_DEV=rxe0 RXE_NETDEV=rxenet0 RXE_IP=10.77.0.1
#
# Output: the command's stdout+stderr stream to this script's stdout (virtio
# serial port -> FIFO -> cat), separate from the guest kernel console, which
# goes to $RUN_DIR/console.log (printed on failure). Exit status = the
# command's; 124 on timeout; 125 when the VM failed before reporting one.
#
# Acceleration: KVM is used only when /dev/kvm can run a stock kernel. Where
# /dev/kvm is provided by kvm_pvm (PVM, a software nested-virt hypervisor
# built for PVM-patched guest kernels), a stock kernel either
# hangs right after "Probing EDD" (bzImage boot), or, booted as PVH ELF, crawls
# through KVM's instruction emulator (~50 s to reach FPU init) and dies with
# "KVM internal error ... emulation failure" (cmpxchg16b, then xrstor);
# -cpu host/max also abort on "failed to set MSR 0x10a". So with kvm_pvm and no
# kvm_intel/kvm_amd we go straight to TCG; elsewhere a 20 s KVM smoke boot is
# probed once and cached. TCG (pure emulation) boots this guest in ~4-5 s.
# Override with RXE_VM_ACCEL=kvm|tcg.
#
# Environment knobs:
#   RXE_VM_SCRATCH  cache + run dirs              (default /tmp/rxe-vm)
#   RXE_VM_RW_DIR   host dir shared read-write    (default $PWD; "" = none)
#   RXE_VM_MEM      guest RAM in MiB              (default 2048)
#   RXE_VM_SMP      guest vCPUs                   (default 2)
#   RXE_VM_TIMEOUT  seconds before qemu is killed (default 900)
#   RXE_VM_ACCEL    kvm | tcg                     (default: probed, see above)
#   RXE_VM_KPKG     Debian kernel package         (default: what linux-image-amd64
#                   depends on, e.g. linux-image-6.1.0-56-amd64)
#   RXE_VM_KEEP=1   keep the per-run dir (console.log, timing, setup.log)
#   RXE_VM_VERBOSE=1  progress + timing lines on stderr
#
# Notes (see examples/ beside this script for verbs, perftest, two-device tests):
#  - rxe accepts any GRH traffic_class and it reaches the wire as the IPv4 TOS
#    byte; the SL is accepted but dropped (ibv_query_qp reports sl=0; RoCE
#    without VLAN has nowhere to carry it).
#  - rdma_rxe needs the "crc32" crypto shash (module crc32_generic): without it
#    `rdma link add` fails with ENOENT ("rdma_rxe: failed to add ...").
#  - two rxe devices in one netns only talk over a real link with policy
#    routing (examples/two-devices-wire.sh); otherwise use the one device rxe0
#    (loopback QPs work).
#  - under TCG, perftest numbers measure the emulator (~0.4 Gb/s), not rxe.
#
# First run needs root + Debian's apt repositories (apt-get install of missing
# packages, apt-get download of the kernel .deb, which is only unpacked with
# dpkg -x into the scratch dir, never installed). Later runs reuse the cache.
set -euo pipefail

T0=$(date +%s.%N)
SCRATCH=${RXE_VM_SCRATCH:-/tmp/rxe-vm}
RW_DIR=${RXE_VM_RW_DIR-$PWD}
MEM=${RXE_VM_MEM:-2048}
SMP=${RXE_VM_SMP:-2}
TIMEOUT=${RXE_VM_TIMEOUT:-900}
SELF=$(readlink -f "${BASH_SOURCE[0]}")

elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN{printf "%.2f", b-a}'; }
log() { if [ "${RXE_VM_VERBOSE:-0}" = 1 ]; then echo "[rxe-vm +$(elapsed "$T0")s] $*" >&2; fi; }
die() { echo "run-in-rxe-vm: $*" >&2; exit 125; }

[ $# -ge 1 ] || die "usage: $0 'command' | prog args..."
mkdir -p "$SCRATCH/debs" "$SCRATCH/kernel" "$SCRATCH/runs"

# ------------------------------------------------------------ host packages
# qemu + busybox for the VM; the RDMA userspace is the host's own, used inside
# the guest through the 9p root share.
PKGS="qemu-system-x86 busybox-static kmod cpio iproute2 rdma-core ibverbs-providers
ibverbs-utils rdmacm-utils perftest libibverbs-dev librdmacm-dev"
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "run-in-rxe-vm: installing:$missing" >&2
  for i in $(seq 1 20); do           # another installer may hold the dpkg lock
    if DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $missing \
         >/dev/null 2>"$SCRATCH/apt.err"; then break; fi
    grep -qi 'lock' "$SCRATCH/apt.err" || apt-get update >/dev/null 2>&1 || true
    [ "$i" = 20 ] && { cat "$SCRATCH/apt.err" >&2; die "apt-get install failed"; }
    sleep 6
  done
fi

# ------------------------------------------------------------ guest kernel
KPKG=${RXE_VM_KPKG:-}
if [ -z "$KPKG" ]; then
  # reuse an already unpacked kernel, else ask apt which one is current
  KPKG=$( (ls -d "$SCRATCH"/kernel/linux-image-*/ 2>/dev/null || true) | xargs -rn1 basename | sort -V | tail -1)
  if [ -z "$KPKG" ]; then
    KPKG=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-/ && !k {k=$2} END{print k}')
    if [ -z "$KPKG" ]; then
      apt-get update >/dev/null 2>&1 || true
      KPKG=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-/ && !k {k=$2} END{print k}')
    fi
  fi
fi
[ -n "$KPKG" ] || die "cannot determine the Debian kernel package"
case "$KPKG" in *cloud*) die "$KPKG: -cloud kernels lack rdma_rxe and 9p; use the plain -amd64 flavour";; esac
KV=${KPKG#linux-image-}                      # e.g. 6.1.0-56-amd64
KROOT="$SCRATCH/kernel/$KPKG"                 # dpkg -x target
if [ ! -f "$KROOT/boot/vmlinuz-$KV" ] || [ ! -f "$KROOT/lib/modules/$KV/modules.dep" ]; then
  log "fetching + unpacking $KPKG"
  deb=$(ls "$SCRATCH"/debs/"${KPKG}"_*.deb 2>/dev/null | tail -1 || true)
  if [ -z "$deb" ]; then
    ( cd "$SCRATCH/debs" && apt-get download "$KPKG" >/dev/null 2>&1 ) || die "apt-get download $KPKG failed"
    deb=$(ls "$SCRATCH"/debs/"${KPKG}"_*.deb | tail -1)
  fi
  rm -rf "$KROOT"; mkdir -p "$KROOT"
  dpkg -x "$deb" "$KROOT"
  depmod -b "$KROOT" "$KV"                    # the .deb ships no modules.dep
fi
ls "$KROOT/lib/modules/$KV/kernel/drivers/infiniband/sw/rxe/"rdma_rxe.ko* >/dev/null 2>&1 \
  || die "$KPKG has no rdma_rxe module"
# Boot the uncompressed ELF vmlinux (PVH entry, CONFIG_PVH=y) rather than the
# bzImage: under TCG, emulating the xz decompressor + real-mode setup costs
# ~3-4 s per boot. Extracted once (xz payload inside the bzImage); the bzImage
# stays the fallback.
KIMG="$KROOT/boot/vmlinuz-$KV"
if [ ! -s "$KROOT/vmlinux" ] && [ ! -f "$KROOT/vmlinux.none" ]; then
  off=$(LC_ALL=C grep -obUaP '\xfd7zXZ\x00' "$KIMG" 2>/dev/null | head -1 | cut -d: -f1 || true)
  # (tail gets SIGPIPE when xz stops at the end of the stream: ignore status)
  [ -n "$off" ] && { tail -c +"$((off + 1))" "$KIMG" | xz -dc --single-stream > "$KROOT/vmlinux.tmp"; } 2>/dev/null || true
  if [ -s "$KROOT/vmlinux.tmp" ] && [ "$(head -c 4 "$KROOT/vmlinux.tmp" | od -An -c | tr -d ' ')" = '177ELF' ]; then
    mv "$KROOT/vmlinux.tmp" "$KROOT/vmlinux"
  else
    rm -f "$KROOT/vmlinux.tmp"; touch "$KROOT/vmlinux.none"
  fi
fi
[ -s "$KROOT/vmlinux" ] && grep -q '^CONFIG_PVH=y' "$KROOT/boot/config-$KV" && KIMG="$KROOT/vmlinux"

# ------------------------------------------------------------ initramfs
# Tiny: static busybox + just the modules needed to reach the host root
# (virtio-pci, 9p, overlay). Everything else (kmod, ip, rdma, ibv_*, perftest,
# glibc, the user's binaries, the rest of the guest's modules) comes over 9p.
# Rebuilt whenever this script changes.
INITRD="$SCRATCH/kernel/initrd-$KV.cpio.gz"
if [ ! -s "$INITRD" ] || [ "$SELF" -nt "$INITRD" ]; then
  log "building initramfs"
  IR=$(mktemp -d "$SCRATCH/initramfs.XXXXXX")
  mkdir -p "$IR"/{bin,dev,proc,sys,mnt,lib/modules}
  cp /bin/busybox "$IR/bin/busybox"
  # insmod order from modprobe --show-depends (dependencies first), deduplicated
  for m in virtio_pci virtio_console 9pnet_virtio 9p overlay; do
    modprobe -d "$KROOT" -S "$KV" --show-depends "$m" | awk '$1=="insmod"{print $2}'
  done | awk '!seen[$0]++' | while read -r ko; do
    b=$(basename "$ko")
    case "$b" in        # busybox insmod cannot read compressed modules (6.1: none are)
      *.ko.xz)  xz -dc "$ko"    > "$IR/lib/modules/${b%.xz}";  b=${b%.xz} ;;
      *.ko.zst) zstd -dqc "$ko" > "$IR/lib/modules/${b%.zst}"; b=${b%.zst} ;;
      *)        cp "$ko" "$IR/lib/modules/$b" ;;
    esac
    echo "$b"
  done > "$IR/modules.list"
  cat > "$IR/init" <<'INIT'
#!/bin/busybox sh
# Guest stage 1 (PID 1, busybox): load virtio/9p/overlay, build the new root =
# host / (9p, read-only) + tmpfs overlay, mount the shares, switch_root into it
# and run stage 2 (/run/rxe-vm/stage2.sh, host's /bin/sh) as PID 1.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
fail() { echo "rxe-vm stage1: $*"; echo o > /proc/sysrq-trigger; sleep 10; }
for m in $(cat /modules.list); do insmod /lib/modules/$m || echo "insmod $m failed"; done
M9="trans=virtio,version=9p2000.L,msize=524288"
R=/mnt/root
mkdir -p /mnt/lower /mnt/ovl $R
mount -t 9p -o $M9,ro,cache=loose hostroot /mnt/lower || fail "9p hostroot mount failed"
mount -t tmpfs -o mode=755 ovl /mnt/ovl && mkdir -p /mnt/ovl/u /mnt/ovl/w
mount -t overlay -o lowerdir=/mnt/lower,upperdir=/mnt/ovl/u,workdir=/mnt/ovl/w,index=off,xino=off,redirect_dir=off,metacopy=off overlay $R \
  || { echo "overlay failed: read-only root"; mount --bind /mnt/lower $R; }
mount -t proc proc $R/proc; mount -t sysfs sys $R/sys; mount -t devtmpfs dev $R/dev
mkdir -p $R/dev/pts $R/dev/shm; mount -t devpts devpts $R/dev/pts; mount -t tmpfs shm $R/dev/shm
mount -t tmpfs run $R/run; mkdir -p $R/run/rxe-vm
mount -t 9p -o $M9,cache=none ctl $R/run/rxe-vm || fail "9p ctl mount failed"
mkdir -p $R/lib/modules && mount -t 9p -o $M9,ro,cache=loose kmod $R/lib/modules || fail "9p kmod mount failed"
. $R/run/rxe-vm/meta                       # RW_DIR=... written by the host
if [ -n "$RW_DIR" ]; then
  mkdir -p $R$RW_DIR && mount -t 9p -o $M9,cache=none work $R$RW_DIR || fail "9p work mount failed"
fi
cut -d' ' -f1 /proc/uptime > $R/run/rxe-vm/t_stage1
exec switch_root $R /bin/sh /run/rxe-vm/stage2.sh
INIT
  chmod +x "$IR/init"
  ( cd "$IR" && find . | cpio -o -H newc --quiet | gzip -1 ) > "$INITRD.tmp.$$"
  mv "$INITRD.tmp.$$" "$INITRD"
  rm -rf "$IR"
fi

# ------------------------------------------------------------ per-run files
RUN_DIR=$(mktemp -d "$SCRATCH/runs/run.XXXXXX")
QPID=""; CATPID=""
cleanup() {
  # only the processes this script started, by PID
  [ -n "$QPID" ] && kill "$QPID" 2>/dev/null || true
  [ -n "$CATPID" ] && kill "$CATPID" 2>/dev/null || true
  [ "${RXE_VM_KEEP:-0}" = 1 ] || rm -rf "$RUN_DIR"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ $# -eq 1 ]; then printf '%s\n' "$1" > "$RUN_DIR/cmd.sh"
else printf '%q ' "$@" > "$RUN_DIR/cmd.sh"; echo >> "$RUN_DIR/cmd.sh"; fi
if [ -n "$RW_DIR" ]; then
  RW_DIR=$(readlink -f "$RW_DIR")
  [ "$RW_DIR" != / ] || { log "not sharing / read-write"; RW_DIR=""; }
fi
printf 'RW_DIR=%s\nWORKDIR=%s\n' "'${RW_DIR//\'/}'" "'${PWD//\'/}'" > "$RUN_DIR/meta"

# Guest stage 2: PID 1 in the new root (host's dash). Sets up rxe, runs the
# command with output on the virtio-serial port "out", stores the exit status
# in the ctl share, powers off.
cat > "$RUN_DIR/stage2.sh" <<'EOF'
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TERM=dumb
export RXE_DEV=rxe0 RXE_NETDEV=rxenet0 RXE_IP=10.77.0.1
C=/run/rxe-vm
. $C/meta
up() { cut -d' ' -f1 /proc/uptime; }
# after "o" the 9p mounts go away, so PID 1 spins on shell builtins until power-off
poweroff_now() { sync; umount "$RW_DIR" 2>/dev/null; umount $C 2>/dev/null; echo o > /proc/sysrq-trigger; while :; do :; done; }
OUT=/dev/ttyS1                                # fallback; normally the virtio port
for d in /sys/class/virtio-ports/*; do [ "$(cat $d/name 2>/dev/null)" = out ] && OUT=/dev/${d##*/}; done
(
  set -e
  modprobe -a crc32_generic rdma_rxe rdma_ucm ib_umad dummy  # rxe needs the crc32 shash
  ip link set lo up
  ip link add rxenet0 type dummy
  ip addr add 10.77.0.1/24 dev rxenet0
  ip link set rxenet0 up
  rdma link add rxe0 type rxe netdev rxenet0
  i=0                                         # wait for port ACTIVE + IPv4 GID
  until rdma link show rxe0/1 | grep -q 'state ACTIVE' &&
        grep -q ':ffff:' /sys/class/infiniband/rxe0/ports/1/gids/1 2>/dev/null; do
    i=$((i+1)); [ $i -lt 200 ] || { echo "rxe0 not ACTIVE"; rdma link show; exit 1; }
    sleep 0.05
  done
) > $C/setup.log 2>&1 </dev/null
src=$?
echo "stage1_done $(cat $C/t_stage1) setup_done $(up)" > $C/timing
if [ $src -ne 0 ]; then
  { echo "rxe-vm: guest setup failed:"; cat $C/setup.log; } > $OUT 2>&1
  echo 125 > $C/rc; poweroff_now
fi
ulimit -l unlimited
cd "$WORKDIR" 2>/dev/null || cd /
SH=/bin/sh; [ -x /bin/bash ] && SH=/bin/bash
$SH $C/cmd.sh > $OUT 2>&1 </dev/null
echo $? > $C/rc
echo "cmd_done $(up)" >> $C/timing
poweroff_now
EOF

# ------------------------------------------------------------ accelerator
kvm_usable() {
  # Cached probe: does a stock kernel get to userspace under this /dev/kvm?
  local cache="$SCRATCH/kernel/kvm-probe-$KV"
  [ -r /dev/kvm ] && [ -w /dev/kvm ] || return 1
  # kvm_pvm alone (no kvm_intel/kvm_amd) can only run PVM-patched guest kernels
  if [ -d /sys/module/kvm_pvm ] && [ ! -d /sys/module/kvm_intel ] && [ ! -d /sys/module/kvm_amd ]; then
    log "/dev/kvm is kvm_pvm: stock kernels cannot run on it, using TCG"; return 1
  fi
  if [ ! -f "$cache" ]; then
    log "probing KVM (20 s max)"
    local p; p=$(mktemp -d "$SCRATCH/kvmprobe.XXXXXX")
    printf '#!/bin/busybox sh\n/bin/busybox echo KVM-PROBE-OK > /dev/ttyS0\n/bin/busybox poweroff -f\n' > "$p/init"
    mkdir "$p/bin" && cp /bin/busybox "$p/bin/" && chmod +x "$p/init"
    ( cd "$p" && echo -e "init\nbin\nbin/busybox" | cpio -o -H newc --quiet ) > "$p/i.cpio"
    timeout -k 2 20 qemu-system-x86_64 -accel kvm -cpu host,-arch-capabilities -m 256 \
      -nodefaults -display none -no-reboot -kernel "$KROOT/boot/vmlinuz-$KV" -initrd "$p/i.cpio" \
      -append "console=ttyS0 panic=-1 loglevel=1" -serial "file:$p/out" </dev/null >/dev/null 2>&1 || true
    if grep -q KVM-PROBE-OK "$p/out" 2>/dev/null; then echo kvm > "$cache"; else echo tcg > "$cache"; fi
    rm -rf "$p"
  fi
  [ "$(cat "$cache")" = kvm ]
}
ACCEL=${RXE_VM_ACCEL:-}
[ -n "$ACCEL" ] || { if kvm_usable; then ACCEL=kvm; else ACCEL=tcg; fi; }
# -cpu host trips "failed to set MSR 0x10a" (ARCH_CAPABILITIES) on nested KVM
if [ "$ACCEL" = kvm ]; then ACC=(-accel kvm -cpu host,-arch-capabilities); else ACC=(-accel tcg,thread=multi -cpu max); fi

# ------------------------------------------------------------ boot
SHARES=(-virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap"
        -virtfs "local,path=$KROOT/lib/modules,mount_tag=kmod,security_model=none,readonly=on"
        -virtfs "local,path=$RUN_DIR,mount_tag=ctl,security_model=none")
[ -n "$RW_DIR" ] && SHARES+=(-virtfs "local,path=$RW_DIR,mount_tag=work,security_model=none,multidevs=remap")

# command output: guest virtio port "out" -> qemu chardev file -> FIFO -> cat -> our stdout
mkfifo "$RUN_DIR/out.fifo"
cat "$RUN_DIR/out.fifo" &
CATPID=$!

log "starting qemu ($ACCEL, ${MEM} MiB, $SMP vCPU, kernel $KV)"
T_QEMU=$(date +%s.%N)
set +e
timeout -k 5 "$TIMEOUT" qemu-system-x86_64 "${ACC[@]}" -m "$MEM" -smp "$SMP" \
  -nodefaults -no-user-config -display none -vga none -no-reboot -nic none \
  -kernel "$KIMG" -initrd "$INITRD" \
  -append "console=ttyS0 loglevel=4 panic=-1 rdinit=/init mitigations=off tsc=reliable" \
  -serial "file:$RUN_DIR/console.log" \
  -device virtio-serial-pci -chardev "file,id=out,path=$RUN_DIR/out.fifo" \
  -device virtserialport,chardev=out,name=out \
  "${SHARES[@]}" </dev/null 2>"$RUN_DIR/qemu.err" &
QPID=$!
wait "$QPID"; QRC=$?
QPID=""
# qemu closed the FIFO -> cat drains it and exits. If qemu died before opening
# it, cat would wait forever for a writer: open+close it once ourselves
# (read-write, so this never blocks).
exec 3<>"$RUN_DIR/out.fifo"; exec 3>&-
wait "$CATPID" 2>/dev/null; CATPID=""
set -e
log "qemu exit $QRC after $(elapsed "$T_QEMU")s; guest uptimes: $(tr '\n' ' ' < "$RUN_DIR/timing" 2>/dev/null || true)"
log "total $(elapsed "$T0")s"

if [ -f "$RUN_DIR/rc" ]; then exit "$(cat "$RUN_DIR/rc")"; fi
if [ "$QRC" = 124 ] || [ "$QRC" = 137 ]; then echo "run-in-rxe-vm: timed out after ${TIMEOUT}s" >&2; rc=124; else rc=125; fi
echo "run-in-rxe-vm: guest did not report an exit status (qemu rc=$QRC). qemu stderr:" >&2
cat "$RUN_DIR/qemu.err" >&2 || true
echo "--- guest console (tail):" >&2
tail -40 "$RUN_DIR/console.log" >&2 || true
exit "$rc"
