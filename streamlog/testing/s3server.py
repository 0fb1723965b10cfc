"""A real S3 endpoint on loopback: Ceph's RADOS Gateway over a one-OSD in-memory cluster.

Strategy: everything lives under one work directory (config, monitor and OSD data, logs,
pid and admin-socket files), so two servers never meet and nothing is written to
/etc/ceph or /var/lib/ceph. The cluster is the smallest that radosgw accepts: one
monitor, one OSD on `memstore`, size-1 pools, no manager, no authentication between the
daemons (radosgw still checks S3 signatures). The first `start()` bootstraps it
(monmaptool, `ceph-mon --mkfs`, `ceph osd create`, `ceph-osd --mkfs`), creates the S3
user and the bucket; a later `start()` on the same directory reuses all of it, so the
objects survive a `stop()` / `start()` (memstore writes its contents out on a clean
shutdown only because the config sets `osd fast shutdown = false`). Every daemon runs in
the foreground in its own session (a Ctrl-C in the terminal reaches only us, and we stop
them in order: radosgw, whose SIGTERM handler otherwise waits up to 120 s for a gone
monitor, then the OSD, then the monitor). Each wait is bounded and its error names the
log to read; each bootstrap step's output is appended to `log/steps.log`.

Ports are picked free at each start, preferring the previous ones so that a restarted
server keeps its endpoint; the monitor's address lives in its monmap, which a restart
therefore rewrites (extract, replace, inject) every time.

Known difference from AWS S3 (Ceph 16.2): a PUT's `If-Match` is compared with the stored
ETag as sent, without removing the quotes that S3 puts around an ETag, so it must be sent
unquoted (`"abc"` answers 412, `abc` succeeds). `If-None-Match: *` works as on S3.

`python -m streamlog.testing.s3server DIR` runs one in the foreground, prints the
variables to export, and stops cleanly on Ctrl-C or SIGTERM.

Thread-safety: an S3Server is driven by one thread; start() and stop() are not reentrant.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from datetime import timedelta
from pathlib import Path

PACKAGES = ("ceph-mon", "ceph-osd", "radosgw", "ceph-common")
COMMANDS = ("ceph-mon", "ceph-osd", "radosgw", "radosgw-admin", "ceph", "monmaptool")
REGION = "us-east-1"
RGW_NAME = "client.rgw"
STATE_FILE = "s3server.json"
INSTALL_TIMEOUT_S = 900
STEP_TIMEOUT_S = 60
MON_UP_TIMEOUT_S = 20
OSD_UP_TIMEOUT_S = 60
RGW_UP_TIMEOUT_S = 60
# Per daemon, in stop order; after the timeout, SIGKILL (memstore then loses its data).
STOP_TIMEOUTS_S = {"radosgw": 30, "ceph-osd": 30, "ceph-mon": 15}
POLL_INTERVAL_S = 0.1

CONFIG = """\
[global]
fsid = {fsid}
mon host = [v2:127.0.0.1:{mon_port}]
mon initial members = a
public addr = 127.0.0.1
cluster addr = 127.0.0.1
auth cluster required = none
auth service required = none
auth client required = none
# Without this radosgw retries "returned -13" forever when authentication is off.
ms mon client mode = crc secure
client mount timeout = 30
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon warn on pool no redundancy = false
mon data avail crit = 1
# The monitor batches map changes for 1 s by default; radosgw's bootstrap creates pools
# one by one, each a map change: 0.05 s brings a cold start from ~15 s to ~2 s.
paxos propose interval = 0.05
keyring = {workdir}/keyring
run dir = {workdir}/run
pid file = {workdir}/run/$cluster-$name.pid
log file = {workdir}/log/$cluster-$name.log
mon data = {workdir}/mon/$cluster-$id
osd data = {workdir}/osd/$cluster-$id

[osd]
osd objectstore = memstore
# memstore's capacity (its default is 1 GiB, and radosgw frees deleted objects only
# hours later: a benchmark or a long test session would fill it, and every PUT would
# then hang until its timeout). Memory is used as data arrives, not up front.
memstore device bytes = 8589934592
# memstore saves its contents only on a full (slow) shutdown.
osd fast shutdown = false

[{rgw_name}]
# Without tcp_nodelay every small response waits ~40 ms for a delayed ACK.
rgw frontends = beast endpoint=127.0.0.1:{rgw_port} tcp_nodelay=1
"""


class S3ServerError(RuntimeError):
    """The server could not be installed, started or stopped; the message says which
    log to read."""


def ensure_installed() -> None:
    """Install Debian's Ceph packages with apt-get unless every command is present.

    Raises:
        S3ServerError: a command is missing and we are not root (or have no apt-get),
            or apt-get failed (the end of its output is in the message).
    """
    if all(shutil.which(command) for command in COMMANDS):
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise S3ServerError(f"radosgw is not installed; as root: apt-get install "
                            f"--no-install-recommends {' '.join(PACKAGES)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for argv in (["apt-get", "update", "-qq"],
                 ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES]):
        done = subprocess.run(argv, env=env, capture_output=True, text=True,
                              timeout=INSTALL_TIMEOUT_S)
        if done.returncode != 0:
            raise S3ServerError(f"{' '.join(argv)} failed: {done.stderr.strip()[-500:]}")
    missing = [command for command in COMMANDS if shutil.which(command) is None]
    if missing:
        raise S3ServerError(f"installed {' '.join(PACKAGES)} but {missing} are missing")


class S3Server:
    """A radosgw on 127.0.0.1 with one bucket, its data under `workdir`.

    After `start()`: `endpoint` ("http://127.0.0.1:PORT"), `access_key`, `secret_key`,
    `region`, `bucket`, `storage_options` (for obstore's S3Store) and `env` (AWS_*
    variables for a child process). `new_prefix()` gives each test its own key space.
    """

    def __init__(self, workdir, *, bucket: str = "streamlog") -> None:
        self.workdir = Path(workdir).resolve()
        self.bucket = bucket
        self.region = REGION
        self.config_path = self.workdir / "ceph.conf"
        self.log_dir = self.workdir / "log"
        self._state: dict = {}
        self._procs: dict[str, subprocess.Popen] = {}

    # -- the public surface --------------------------------------------------------------

    @classmethod
    def attach(cls, workdir, *, bucket: str = "streamlog") -> S3Server | None:
        """The server another process started in `workdir`, or None if none runs there.
        Its `stop()` works by pid."""
        server = cls(workdir, bucket=bucket)
        server._state = server._load_state()
        pids = server._state.get("pids") or {}
        if not pids or not all(_pid_alive(pid, name) for name, pid in pids.items()):
            return None
        return server

    @property
    def running(self) -> bool:
        return bool(self._state.get("pids"))

    @property
    def pids(self) -> dict[str, int]:
        """Daemon name ("ceph-mon", "ceph-osd", "radosgw") -> pid, while running."""
        return dict(self._state.get("pids") or {})

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._state['rgw_port']}"

    @property
    def access_key(self) -> str:
        return self._state["access_key"]

    @property
    def secret_key(self) -> str:
        return self._state["secret_key"]

    @property
    def storage_options(self) -> dict[str, str]:
        """Keyword arguments for `obstore.store.S3Store(bucket, **storage_options)`."""
        return {"endpoint": self.endpoint, "access_key_id": self.access_key,
                "secret_access_key": self.secret_key, "region": self.region,
                "allow_http": "true", "virtual_hosted_style_request": "false"}

    @property
    def env(self) -> dict[str, str]:
        """The AWS_* variables that point a child process at this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_REGION": self.region,
                "AWS_ALLOW_HTTP": "true"}

    def new_prefix(self) -> str:
        """A key prefix no one has used, so tests sharing the bucket never meet."""
        return f"t-{uuid.uuid4().hex[:16]}"

    def url(self, prefix: str = "") -> str:
        """"s3://BUCKET/PREFIX"; `url(new_prefix())` for a fresh one."""
        return f"s3://{self.bucket}/{prefix}"

    def start(self) -> S3Server:
        """Install the packages if need be, bootstrap or reuse the cluster in `workdir`,
        start monitor, OSD and radosgw, and make sure the user and bucket exist.

        Raises:
            S3ServerError: a step failed or a wait ran out; the message names the log.
        """
        assert not self._procs, "start() on a running server"
        ensure_installed()
        for name in ("log", "run", "mon", "osd"):
            (self.workdir / name).mkdir(parents=True, exist_ok=True)
        self._state = self._load_state()
        if self._state.get("pids"):  # Left by a process that died before its stop().
            self.stop()
        fresh = not self._state.get("bootstrapped")
        if fresh:
            self._state = self._new_state(had_state=bool(self._state))
        self._state["mon_port"] = _free_port(self._state.get("mon_port"))
        self._state["rgw_port"] = _free_port(self._state.get("rgw_port"))
        self.config_path.write_text(CONFIG.format(workdir=self.workdir, rgw_name=RGW_NAME,
                                                  **self._state))
        self._save_state()
        try:
            self._start_daemons(fresh=fresh)
            if fresh:
                self._create_user()
            self._state["bootstrapped"] = True
            self._create_bucket()
        except BaseException:
            self.stop()
            raise
        self._save_state()
        return self

    def stop(self) -> None:
        """Stop radosgw, then the OSD, then the monitor (SIGTERM, SIGKILL after
        STOP_TIMEOUTS_S). Does nothing if nothing runs."""
        pids = self._state.get("pids") or {}
        for name, timeout_s in STOP_TIMEOUTS_S.items():
            if name in pids:
                _stop_process(name, pids[name], self._procs.get(name), timeout_s)
        self._procs.clear()
        if self._state:
            self._state["pids"] = {}
            self._save_state()

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    # -- bootstrap and start-up ------------------------------------------------------------

    def _new_state(self, *, had_state: bool) -> dict:
        for name in ("mon", "osd"):
            path = self.workdir / name
            if not had_state and any(path.iterdir()):
                raise S3ServerError(f"{path} is not empty but {STATE_FILE} is missing: "
                                    f"{self.workdir} does not look like a server's directory")
            # Leftovers of a start that never finished would contradict the new fsid.
            shutil.rmtree(path)
            path.mkdir()
        return {"fsid": str(uuid.uuid4()), "access_key": "SL" + secrets.token_hex(9).upper(),
                "secret_key": secrets.token_hex(20), "pids": {}}

    def _start_daemons(self, *, fresh: bool) -> None:
        conf = str(self.config_path)
        monmap = str(self.workdir / "monmap")
        mon_address = f"[v2:127.0.0.1:{self._state['mon_port']}]"
        if fresh:
            self._run("monmaptool", "--create", "--clobber", "--fsid", self._state["fsid"],
                      "--addv", "a", mon_address, monmap)
            self._run("ceph-mon", "--mkfs", "-i", "a", "--monmap", monmap, "-c", conf)
        else:  # The monitor's address is in its monmap: move it to this start's port.
            self._run("ceph-mon", "-i", "a", "-c", conf, "--extract-monmap", monmap)
            self._run("monmaptool", "--rm", "a", monmap)
            self._run("monmaptool", "--addv", "a", mon_address, monmap)
            self._run("ceph-mon", "-i", "a", "-c", conf, "--inject-monmap", monmap)
        self._spawn("ceph-mon", "-f", "-i", "a", "-c", conf)
        self._wait("ceph-mon", MON_UP_TIMEOUT_S,
                   lambda: _port_open(self._state["mon_port"]))
        if fresh:
            osd_id = self._ceph("osd", "create").strip()
            assert osd_id == "0", osd_id
            (self.workdir / "osd" / "ceph-0").mkdir()  # memstore's mkfs wants it there.
            self._run("ceph-osd", "-i", "0", "--mkfs", "-c", conf)
        self._spawn("ceph-osd", "-f", "-i", "0", "-c", conf)
        self._wait("ceph-osd", OSD_UP_TIMEOUT_S, self._osd_up)
        self._spawn("radosgw", "-f", "-n", RGW_NAME, "-c", conf)
        self._wait("radosgw", RGW_UP_TIMEOUT_S, self._rgw_answers)

    def _osd_up(self) -> bool:
        stat = json.loads(self._ceph("osd", "stat", "--format", "json", timeout_s=10))
        return stat.get("num_up_osds", 0) >= 1

    def _rgw_answers(self) -> bool:
        try:
            with urllib.request.urlopen(self.endpoint, timeout=2):
                return True
        except urllib.error.HTTPError:
            return True  # Any HTTP answer means the frontend serves.
        except OSError:
            return False

    def _create_user(self) -> None:
        self._run("radosgw-admin", "-c", str(self.config_path), "user", "create",
                  "--uid=streamlog", "--display-name=streamlog",
                  f"--access-key={self.access_key}", f"--secret={self.secret_key}")

    def _create_bucket(self) -> None:
        """PUT /BUCKET, signed by obstore (a presigned URL for the empty key is the
        bucket's URL), since obstore itself cannot create buckets."""
        import obstore
        from obstore.store import S3Store
        store = S3Store(self.bucket, **self.storage_options)
        url = obstore.sign(store, "PUT", "", timedelta(minutes=5))
        request = urllib.request.Request(url, method="PUT", data=b"")
        try:
            with urllib.request.urlopen(request, timeout=STEP_TIMEOUT_S):
                pass
        except urllib.error.HTTPError as error:
            body = error.read().decode(errors="replace")
            if error.code != 409 or "BucketAlreadyOwnedByYou" not in body:
                raise S3ServerError(f"creating bucket {self.bucket}: {error.code} {body}; "
                                    f"see {self.log_dir / 'ceph-client.rgw.log'}") from None

    # -- processes ---------------------------------------------------------------------------

    def _run(self, *argv: str, timeout_s: float = STEP_TIMEOUT_S) -> str:
        """Run one bootstrap step; its output goes to log/steps.log. Returns stdout."""
        steps_log = self.log_dir / "steps.log"
        try:
            done = subprocess.run(argv, cwd=self.workdir, capture_output=True, text=True,
                                  stdin=subprocess.DEVNULL, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise S3ServerError(f"{' '.join(argv)} took over {timeout_s} s; "
                                f"see {self.log_dir}") from None
        with open(steps_log, "a") as log:
            log.write(f"$ {' '.join(argv)}\n[exit {done.returncode}]\n"
                      f"{done.stdout}{done.stderr}\n")
        if done.returncode != 0:
            raise S3ServerError(f"{' '.join(argv)} failed (exit {done.returncode}): "
                                f"{done.stderr.strip()[-500:]}; see {steps_log}")
        return done.stdout

    def _ceph(self, *args: str, timeout_s: float = STEP_TIMEOUT_S) -> str:
        return self._run("ceph", "-c", str(self.config_path),
                         "--connect-timeout", str(int(timeout_s)), *args,
                         timeout_s=timeout_s + 5)

    def _spawn(self, name: str, *args: str) -> None:
        # Own session: a terminal's Ctrl-C reaches only us, and we stop them in order.
        with open(self.log_dir / f"{name}.out", "ab") as out:
            proc = subprocess.Popen([name, *args], cwd=self.workdir, stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        self._procs[name] = proc
        self._state["pids"][name] = proc.pid
        self._save_state()  # So that a later start() can stop it if we die first.

    def _wait(self, name: str, timeout_s: float, ready) -> None:
        """Poll `ready()` until true; raise if `name` exits or the time runs out."""
        deadline = time.monotonic() + timeout_s
        proc = self._procs[name]
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise S3ServerError(f"{name} exited with {proc.returncode} while starting; "
                                    f"see {self._logs_of(name)}")
            try:
                if ready():
                    return
            except S3ServerError:
                pass  # Not answering yet; the deadline decides.
            time.sleep(POLL_INTERVAL_S)
        raise S3ServerError(f"{name} not ready after {timeout_s} s; see {self._logs_of(name)}")

    def _logs_of(self, name: str) -> str:
        daemon_log = {"ceph-mon": "ceph-mon.a.log", "ceph-osd": "ceph-osd.0.log",
                      "radosgw": f"ceph-{RGW_NAME}.log"}[name]
        return f"{self.log_dir / daemon_log} and {self.log_dir / (name + '.out')}"

    def _load_state(self) -> dict:
        path = self.workdir / STATE_FILE
        return json.loads(path.read_text()) if path.exists() else {}

    def _save_state(self) -> None:
        path = self.workdir / STATE_FILE
        path.with_suffix(".tmp").write_text(json.dumps(self._state, indent=1))
        path.with_suffix(".tmp").replace(path)


def _free_port(preferred: int | None) -> int:
    """`preferred` if it can be bound on 127.0.0.1 now, else a port the kernel picks."""
    for port in ((preferred,) if preferred else ()) + (0,):
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # As the daemons do.
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return probe.getsockname()[1]
    raise AssertionError("binding port 0 failed")  # pragma: no cover


def _port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def _pid_alive(pid: int, name: str) -> bool:
    """True if `pid` runs and is `name` (a reused pid or a zombie does not count)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    command, state = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2]
    return state != "Z" and name.startswith(command)


def _stop_process(name: str, pid: int, proc: subprocess.Popen | None,
                  timeout_s: float) -> None:
    """SIGTERM, wait up to `timeout_s`, then SIGKILL; `proc` (our child) is reaped."""
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10)):
        if not _pid_alive(pid, name):
            break
        os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while _pid_alive(pid, name) and time.monotonic() < deadline:
            time.sleep(POLL_INTERVAL_S)
    if proc is not None:
        proc.wait(10)
    if _pid_alive(pid, name):
        raise S3ServerError(f"{name} (pid {pid}) survived SIGKILL")


def main(argv: list[str] | None = None) -> None:
    """`python -m streamlog.testing.s3server [DIR]`: run a server until Ctrl-C / SIGTERM."""
    import argparse
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("workdir", nargs="?", default="data/s3",
                        help="where config, data and logs live (default: data/s3)")
    parser.add_argument("--bucket", default="streamlog")
    options = parser.parse_args(argv)
    # SIGTERM takes the same way out as Ctrl-C, through the finally below.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    server = S3Server(options.workdir, bucket=options.bucket)
    try:
        started_s = time.monotonic()
        server.start()
        for name, value in server.env.items():
            print(f"export {name}={value}")
        print(f"# {server.url()}  (started in {time.monotonic() - started_s:.1f} s; "
              f"logs in {server.log_dir}; Ctrl-C stops it)", flush=True)
        while True:
            signal.pause()
    except KeyboardInterrupt:
        pass
    except S3ServerError as error:
        raise SystemExit(f"s3server: {error}") from None
    finally:
        server.stop()


if __name__ == "__main__":
    main()
