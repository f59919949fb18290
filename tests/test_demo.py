"""`python -m mongo_saver.demo` runs end to end against the session's server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from pymongo import MongoClient

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_demo_runs_end_to_end(mongodb_uri: str, db_name: str) -> None:
    env = {**os.environ, "MONGODB_URI": mongodb_uri, "COLUMNS": "150"}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "mongo_saver.demo", "--db", db_name],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        out = done.stdout
        assert done.returncode == 0, f"stdout:\n{out}\nstderr:\n{done.stderr}"
        assert "Traceback" not in done.stderr
        # it used our server instead of starting its own
        assert "Using the MongoDB server named by MONGODB_URI." in out
        # 1. memory across invocations
        assert "assistant: Your name is Ada." in out
        # 2. crash, then a resume in another process that does not repeat finished nodes
        assert "The run failed: simulated crash inside the assistant node." in out
        assert "next = ('assistant',); resuming." in out
        assert "nodes run in this process: assistant (" in out
        # 3. time travel
        assert "the assistant ran again (assistant)" in out
        assert "assistant: Your name is Grace." in out
        assert "The original timeline is untouched" in out
        # 4. the live migration
        assert "{'text': \"A checkpoint is a snapshot" in out
        assert "route = 'SEARCH'" in out
        assert "retrieved_context present: False" in out
        assert " 0 still in the old shape." in out
        assert "(nobody read it, so nothing rewrote it)" in out
        # 5. the CLI ran
        assert "$ mongo-saver" in out and "History of thread 'demo-chat'" in out
        assert "the CLI failed" not in out

        with MongoClient(mongodb_uri) as client:
            checkpoints = client[db_name]["checkpoints"]
            versions: dict[str, set[Any]] = {}
            for doc in checkpoints.find({}, {"thread_id": 1, "schema_version": 1}):
                versions.setdefault(doc["thread_id"], set()).add(doc["schema_version"])
        assert versions == {"demo-chat": {2}, "demo-untouched": {1}}
    finally:
        with MongoClient(mongodb_uri) as client:
            client.drop_database(db_name)
