"""Documents over HTTP through real processes: upload PDF, text and markdown to a real API,
a real worker embeds them with the real model, the results come back; a PNG is 415, a file
over the limit 413; ``tierq upload --wait`` does the same from the command line."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from tests.e2e.harness import System, running, system_env, wait_terminal
from tests.pdf_for_tests import make_pdf
from tests.services import RedisServer

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.models,
    pytest.mark.timeout(180),
]

MAX_DOCUMENT_BYTES = 4096
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00"


@pytest.fixture
def system(
    tmp_path: Path, pg_url: str, redis_server: RedisServer, key_prefix: str,
    redis_client: redis.Redis,  # deletes this test's keys afterwards
) -> Iterator[System]:
    env = system_env(
        database_url=pg_url, redis_url=redis_server.url, key_prefix=key_prefix,
        extra={"TIERQ_BLOB_URL": str(tmp_path / "blobs"),
               "TIERQ_API__MAX_DOCUMENT_BYTES": str(MAX_DOCUMENT_BYTES),
               "TIERQ_POLICY__MEAN_SERVICE_S": "0.5"},
    )
    with running(System(env=env, workdir=tmp_path)) as sys_:
        sys_.start_all(concurrency=1)
        yield sys_


def upload(client: httpx.Client, name: str, data: bytes, **form: str) -> httpx.Response:
    return client.post("/v1/documents", files={"file": (name, data)}, data=form)


def test_documents_round_trip_and_bad_files_are_refused(system: System, tmp_path: Path) -> None:
    acme = system.tenant("acme", "standard")
    system.wait_for_capacity(acme, 1)
    files = {
        "report.pdf": (make_pdf(["Quarterly report: GPU hours rose.", "Costs fell."]),
                       "application/pdf", "GPU hours rose"),
        "notes.txt": (b"Meeting notes.\n\nThe queue drained by noon.", "text/plain",
                      "queue drained"),
        "readme.md": (b"# Tierq\n\nA *tiered* job scheduler.\n", "text/markdown", "scheduler"),
    }
    accepted = {}
    for name, (data, content_type, _) in files.items():
        response = upload(acme, name, data)
        assert response.status_code == 202, response.text
        body = response.json()
        assert response.headers["Location"] == f"/v1/jobs/{body['id']}"
        assert body["status"] == "queued" and body["tier"] == "standard"
        assert body["document"]["content_type"] == content_type
        assert body["document"]["bytes"] == len(data)
        assert (tmp_path / "blobs" / body["document"]["sha256"][:2]
                / body["document"]["sha256"]).read_bytes() == data
        accepted[name] = body["id"]

    for name, job_id in accepted.items():
        job = wait_terminal(acme, job_id, timeout=90)
        assert job["status"] == "succeeded", (name, job)
        result = acme.get(f"/v1/jobs/{job_id}/result").json()["result"]
        assert result["dimensions"] == 384
        assert result["model"] == "sentence-transformers/all-MiniLM-L6-v2"
        assert all(len(c["embedding"]) == 384 for c in result["chunks"])
        assert files[name][2] in " ".join(c["text"] for c in result["chunks"])

    refused = upload(acme, "picture.txt", PNG)
    assert refused.status_code == 415, refused.text
    assert refused.json()["error"]["type"] == "unsupported_media_type"

    too_large = upload(acme, "big.txt", b"word " * (MAX_DOCUMENT_BYTES // 5 + 1))
    assert too_large.status_code == 413, too_large.text
    assert too_large.json()["error"]["type"] == "payload_too_large"

    unknown = upload(acme, "notes.txt", b"some text", kind="transcode")
    assert unknown.status_code == 422
    assert unknown.json()["error"]["type"] == "invalid_request"
    assert len([p for p in (tmp_path / "blobs").rglob("*") if p.is_file()]) == 3  # nothing more

    key = acme.headers["Authorization"].removeprefix("Bearer ")
    document = tmp_path / "cli.md"
    document.write_text("# From the command line\n\nUploaded and waited for.\n")
    cli = subprocess.run(
        [sys.executable, "-m", "jobs.cli", "upload", str(document), "--wait",
         "--api", system.url, "--key", key],
        env=system.env, capture_output=True, text=True, timeout=120, check=False,
    )
    assert cli.returncode == 0, cli.stderr
    first, _, rest = cli.stdout.partition("\n")
    assert "text/markdown" in first and "sha256" in first
    assert json.loads(rest)["dimensions"] == 384
