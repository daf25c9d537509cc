"""Profile tierq's processes under load: the stack of the end-to-end bench, no-op jobs from 8
client threads, each process sampled by py-spy (``--gil``: where the CPU goes) meanwhile.

    python bench/profile_stack.py [--jobs 6000] [--hold-ms 0] [--seconds 20] [--out DIR]

Writes ``<out>/<process>.txt`` (py-spy's raw format, one stack per line with its count) and
prints each process's heaviest functions, inclusive. py-spy comes with the dev extra; the
bench's PostgreSQL and Redis are found as in ``bench/e2e.py``.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from e2e_stack import bench_redis, tierq
from submit import postgres_admin_url, throwaway_database


def heaviest(path: Path, count: int) -> list[tuple[float, str]]:
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, samples = line.rpartition(" ")
        if not stack:
            continue
        n = int(samples)
        total += n
        seen = set()
        for frame in stack.split(";"):
            name = frame.split(" (")[0] + " " + frame.split(" (")[-1].split(":")[0].rstrip(")")
            if name not in seen:
                seen.add(name)
                inclusive[name] += n
    return [(100 * n / max(total, 1), name) for name, n in inclusive.most_common(count)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=6000)
    parser.add_argument("--seconds", type=int, default=20, help="how long each is sampled")
    parser.add_argument("--top", type=int, default=45)
    parser.add_argument("--out", type=Path, default=Path(tempfile.mkdtemp(prefix="tierq-prof-")))
    args = parser.parse_args()
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    args.out.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="tierq-prof-run-"))
    with bench_redis(workdir) as server, postgres_admin_url() as admin_url, \
            throwaway_database(admin_url) as database_url, \
            tierq(database_url, server.url, workdir, tenants=8) as system:
        keys = list(system.tenant_keys)

        def sender(i: int) -> None:
            with system.http(keys[i % len(keys)]) as http:
                for n in range(i, args.jobs, 8):
                    http.post("/v1/jobs", json={"kind": "echo", "payload": {"n": n}})

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            sent = [pool.submit(sender, i) for i in range(8)]
            time.sleep(2)
            spies = [subprocess.Popen([spy, "record", "-p", str(p.pid), "-d", str(args.seconds),
                                       "-r", "200", "--gil", "-f", "raw", "--nonblocking",
                                       "-o", str(args.out / f"{name}.txt")],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                     for name, p in system.processes.items()]
            for spy_process in spies:
                spy_process.wait()
            for future in sent:
                future.result()
    for name in system.processes:
        path = args.out / f"{name}.txt"
        print(f"== {name} ({path})")
        if path.exists():
            for share, frame in heaviest(path, args.top):
                print(f"{share:5.1f}%  {frame}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
