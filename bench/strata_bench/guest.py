"""The TCG test guest (scripts/guest) that the vdi case boots: its kernel
and initramfs, and one boot with the STRATA-GUEST-* lines it printed."""
import os
import subprocess
import time

from .common import ROOT


GUEST_DIR = os.path.join(ROOT, "target", "guest")


def guest_image():
    """(kernel, initramfs) of the test guest (scripts/guest), built or reused
    in target/guest as the guest test does."""
    r = subprocess.run(["bash", os.path.join(ROOT, "scripts/guest/build-initramfs.sh"), GUEST_DIR],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"the guest image could not be built (exit {r.returncode}; "
                           f"scripts/install-deps.sh installs what it needs):\n{r.stderr[-2000:]}")
    with open(os.path.join(GUEST_DIR, "kernel")) as f:
        return f.read().strip(), os.path.join(GUEST_DIR, "initramfs.cpio.gz")


def boot_guest(img, sock, export, test, log, timeout=900, **params):
    """Boots the TCG guest (scripts/guest/init) with /dev/vda = NBD export
    EXPORT on Unix socket SOCK and `strata.test=TEST strata.K=V...`, waits
    for its power-off and returns its STRATA-GUEST-* lines as
    {marker: [rest of line]}; raises with the console unless it printed
    `STRATA-GUEST-OK TEST` and no FAIL line."""
    cmdline = " ".join(["console=ttyS0 panic=-1 loglevel=4", f"strata.test={test}"]
                       + [f"strata.{k}={v}" for k, v in params.items()])
    drive = f"file=nbd:unix:{sock}:exportname={export},format=raw,if=virtio,cache=none,discard=unmap"
    t0 = time.time()
    p = subprocess.Popen(["qemu-system-x86_64", "-accel", "tcg", "-m", "256", "-smp", "1",
                          "-display", "none", "-monitor", "none", "-no-reboot",
                          "-serial", f"file:{log}", "-kernel", img[0], "-initrd", img[1],
                          "-append", cmdline, "-drive", drive],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True)
    try:
        _, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate()
    with open(log, errors="replace") as f:
        console = f.read()
    lines = {}
    for line in console.splitlines():
        i = line.find("STRATA-GUEST-")
        if i >= 0:
            marker, _, rest = line[i + len("STRATA-GUEST-"):].partition(" ")
            lines.setdefault(marker, []).append(rest.strip())
    if test not in lines.get("OK", []) or lines.get("FAIL") or p.returncode != 0:
        raise RuntimeError(f"guest {test} on {export} failed (qemu exit {p.returncode}, "
                           f"{time.time() - t0:.0f} s): {lines.get('FAIL')}\n{err[-1000:]}\n"
                           f"--- console ---\n{console[-4000:]}")
    lines["boot_s"] = round(time.time() - t0, 1)
    return lines
