"""Part 2, throughput: uploads and downloads through the SDK, content checked by SHA-256."""

from __future__ import annotations

import hashlib
import os
import statistics
from collections.abc import Callable
from typing import Any

from tests.envd.harness import EnvdSandbox

from bench.envd_bench.common import MIB, Report, Throughput, time_interleaved


def measure_throughput(
    report: Report, sandbox: Any, envd: EnvdSandbox, size_mib: int, runs: int
) -> None:
    """Uploads and downloads of ``size_mib`` random bytes, each variant ``runs`` times.

    Each variant is verified once (untimed) by SHA-256: uploads against the file as it landed
    on the sandbox's scratch directory, downloads against the source. The timed transfers do
    no client-side copying or hashing beyond what the SDK itself does.
    """
    data = os.urandom(size_mib * MIB)  # random: no layer can cheat by compressing
    digest = hashlib.sha256(data).hexdigest()
    chunks = [data[i : i + MIB] for i in range(0, len(data), MIB)]  # split once, untimed
    path = "/home/user/bench-transfer.bin"

    def uploaded_ok() -> bool:
        with open(envd.host_path(path), "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest() == digest

    def read_bytes() -> object:
        return sandbox.files.read(path, format="bytes")

    def read_stream() -> object:
        for _ in sandbox.files.read(path, format="stream"):
            pass
        return None

    def read_bytes_ok() -> bool:
        return hashlib.sha256(sandbox.files.read(path, format="bytes")).hexdigest() == digest

    def read_stream_ok() -> bool:
        h = hashlib.sha256()
        for chunk in sandbox.files.read(path, format="stream"):
            h.update(chunk)
        return h.hexdigest() == digest

    def upload(fn: Callable[[], object]) -> Callable[[], bool]:
        def upload_and_check() -> bool:
            fn()
            return uploaded_ok()

        return upload_and_check

    def write_multipart() -> object:
        return sandbox.files.write(path, data)

    def write_octet() -> object:
        return sandbox.files.write(path, data, use_octet_stream=True)

    def write_iter() -> object:  # an iterable body: the SDK streams it as octet-stream
        return sandbox.files.write(path, iter(chunks))

    # name -> (timed transfer, untimed verifying transfer); uploads first so the file exists.
    variants: dict[str, tuple[Callable[[], object], Callable[[], bool]]] = {
        "upload multipart (bytes)": (write_multipart, upload(write_multipart)),
        "upload octet-stream (bytes)": (write_octet, upload(write_octet)),
        "upload octet-stream (1 MiB iterator)": (write_iter, upload(write_iter)),
        "download bytes": (read_bytes, read_bytes_ok),
        "download stream": (read_stream, read_stream_ok),
    }
    verified: dict[str, bool] = {}
    working: dict[str, Callable[[], object]] = {}
    for name, (transfer, verify) in variants.items():
        try:
            verified[name] = verify()
            working[name] = transfer
        except Exception as exc:  # an unfinished /files: report it, measure the rest
            error = f"{type(exc).__name__}: {str(exc)[:300]}"
            report.throughput.append(Throughput(name, size_mib, 0, 0, 0, 0, False, error))
            report.errors.append(f"{name}: {error}")
            if name.startswith("upload") and not envd.host_path(path).exists():
                envd.host_path(path).parent.mkdir(parents=True, exist_ok=True)
                envd.host_path(path).write_bytes(data)  # downloads need the file regardless
    for name, ms in time_interleaved(working, runs, warmup=0).items():
        rates = [size_mib / (t / 1000) for t in ms]
        report.throughput.append(
            Throughput(
                name,
                size_mib,
                runs,
                round(statistics.median(rates), 1),
                round(min(rates), 1),
                round(max(rates), 1),
                verified[name],
            )
        )
    order = list(variants)
    report.throughput.sort(key=lambda t: order.index(t.name))
    try:
        sandbox.files.remove(path)
    except Exception:
        envd.host_path(path).unlink(missing_ok=True)
