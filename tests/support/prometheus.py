"""A real monitoring stack on this machine for a test: the distribution's node exporter with only
its textfile collector, reading the directory a check writes its metrics into, and Prometheus
scraping it every SCRAPE_S with alert rules loaded; the test asks Prometheus' HTTP query API what
an operator's dashboard or alert rule would ask.

Everything lives in one temporary directory (configuration, the TSDB, logs).  Both daemons listen
on free ports of the loopback address only, so a system Prometheus (9090) or node exporter (9100)
on the machine is never touched; they run in the foreground as this process's children, each in
its own session, and are stopped by PID whatever the outcome, so none outlives the `Monitoring`
context.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from tests.support import daemons

PROMETHEUS, NODE_EXPORTER, PROMTOOL = "prometheus", "prometheus-node-exporter", "promtool"
LOOPBACK = daemons.LOOPBACK
SCRAPE_S = 1                # scrape and rule evaluation interval: a verdict is seen in seconds
UP_TIMEOUT_S = 30           # each daemon answers in about a second here
POLL_S = 0.2
HTTP_TIMEOUT_S = 5
# urllib would send a request for the loopback address through a proxy named in the environment
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def why_unavailable() -> str | None:
    """None when Debian's prometheus and prometheus-node-exporter are installed, else why not."""
    missing = [n for n in (PROMETHEUS, NODE_EXPORTER, PROMTOOL) if shutil.which(n) is None]
    if missing:
        return (f"Prometheus is not installed ({', '.join(missing)} missing): .ci/run installs "
                "the distribution's prometheus and prometheus-node-exporter when it runs as root")
    return None


def _get(url: str) -> tuple[int, bytes]:
    try:
        with _OPENER.open(url, timeout=HTTP_TIMEOUT_S) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, OSError):
        return 0, b""


class Monitoring:
    """`with Monitoring(tmp, textfile_dir, rules) as m:` node exporter reading `textfile_dir`,
    Prometheus scraping it with the `rules` files loaded, both answering on entry.
    `m.query(expr)` is an instant query's result vector; `m.wait_for(expr)` polls it until it is
    not empty; `m.alerts()` lists the alerts with their annotations; `m.pids` are the daemons'."""

    def __init__(self, where: Path, textfile_dir: Path, rules: tuple = ()):
        self.dir = Path(where)
        self.textfile_dir = Path(textfile_dir)
        self.rules = [str(r) for r in rules]
        self.procs: list[subprocess.Popen] = []
        self.exporter_port, self.prometheus_port = daemons.free_ports(2)
        self.base = f"http://{LOOPBACK}:{self.prometheus_port}"

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def _start(self, *argv: str, log: str) -> None:
        out = open(self.dir / log, "ab")
        self.procs.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL, start_new_session=True))
        out.close()

    def _wait(self, url: str, what: str) -> None:
        deadline = time.monotonic() + UP_TIMEOUT_S
        while time.monotonic() < deadline:
            dead = [p.args[0] for p in self.procs if p.poll() is not None]
            if dead:
                raise RuntimeError(f"{dead} exited while starting\n{self.logs()}")
            if _get(url)[0] == 200:
                return
            time.sleep(POLL_S)
        raise RuntimeError(f"{what} not answering after {UP_TIMEOUT_S} s\n{self.logs()}")

    def __enter__(self) -> "Monitoring":
        self.dir.mkdir(parents=True, exist_ok=True)
        config = self.dir / "prometheus.yml"
        config.write_text(json.dumps({        # JSON is YAML: no YAML writer needed
            "global": {"scrape_interval": f"{SCRAPE_S}s", "evaluation_interval": f"{SCRAPE_S}s"},
            "rule_files": self.rules,
            "scrape_configs": [{"job_name": "node", "static_configs": [
                {"targets": [f"{LOOPBACK}:{self.exporter_port}"]}]}]}, indent=1))
        try:
            self._start(shutil.which(NODE_EXPORTER),
                        f"--web.listen-address={LOOPBACK}:{self.exporter_port}",
                        "--collector.disable-defaults", "--collector.textfile",
                        f"--collector.textfile.directory={self.textfile_dir}",
                        log="node-exporter.log")
            self._wait(f"http://{LOOPBACK}:{self.exporter_port}/metrics", "node exporter")
            self._start(shutil.which(PROMETHEUS), f"--config.file={config}",
                        f"--storage.tsdb.path={self.dir / 'data'}",
                        f"--web.listen-address={LOOPBACK}:{self.prometheus_port}",
                        log="prometheus.log")
            self._wait(f"{self.base}/-/ready", "Prometheus")
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _api(self, path: str, **params) -> dict:
        url = f"{self.base}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        code, body = _get(url)
        if code != 200:
            raise RuntimeError(f"{url}: HTTP {code}: {body[:500]!r}\n{self.logs()}")
        doc = json.loads(body)
        if doc.get("status") != "success":
            raise RuntimeError(f"{url}: {doc}")
        return doc["data"]

    def query(self, expr: str) -> list[dict]:
        """An instant query's result vector: [{"metric": {labels}, "value": [t, "v"]}, ...]."""
        return self._api("query", query=expr)["result"]

    def wait_for(self, expr: str, timeout: float = UP_TIMEOUT_S) -> list[dict]:
        """The query's result once it is not empty, polling every POLL_S until `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.query(expr)
            if found:
                return found
            if time.monotonic() > deadline:
                raise TimeoutError(f"no series for {expr} after {timeout} s\n{self.logs()}")
            time.sleep(POLL_S)

    def alerts(self) -> list[dict]:
        """Every pending or firing alert: labels, annotations, state."""
        return self._api("alerts")["alerts"]

    def logs(self, tail: int = 30) -> str:
        return daemons.log_tails(self.dir.glob("*.log"), tail)

    def stop(self) -> None:
        """Every daemon started here, by PID: SIGTERM, then SIGKILL; reaped."""
        daemons.stop(self.procs)
