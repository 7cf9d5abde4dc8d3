"""deploy/compose.yaml's stack as processes on this machine, for want of a container engine.

Each service gets a folder that stands for its container's filesystem: what the compose file
mounts into it (files, secrets, volumes, tmpfs) is copied there at the same path. The process
each image runs is started with that folder's paths, the compose file's environment, and the
services' host names and ports translated to free ports on 127.0.0.1; nothing else is changed.
Secrets are made as the README's "Deploy" section makes them."""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.brokers import free_port, mosquitto_binary
from tests.deploy.conftest import DEPLOY, load_one, program
from tests.deploy.test_mosquitto import localise

COMPOSE = DEPLOY / "compose.yaml"
DOCKERFILE = DEPLOY.parent / "Dockerfile"
# What each image runs when the compose file gives no command: the upstream images' CMD
# (eclipse-mosquitto's and prom/prometheus', less the console template flags, which name
# folders only the image has) and the ENTRYPOINT of ./Dockerfile (checked against it).
IMAGE_COMMANDS = {
    "eclipse-mosquitto:2.0": ("mosquitto", "-c", "/mosquitto/config/mosquitto.conf"),
    "prom/prometheus:v2.55.1": (
        "prometheus",
        "--config.file=/etc/prometheus/prometheus.yml",
        "--storage.tsdb.path=/prometheus",
    ),
    "iotgw:latest": ("iotgw", "serve"),
}
# The iotgw image's environment that names folders (./Dockerfile's ENV, checked against it),
# all on its tmpfs; its model repository is the test's, and the rest it sets is overridden by
# the compose file or does not change what runs.
IOTGW_IMAGE_ENV = {
    "HOME": "/tmp",
    "TMPDIR": "/tmp",
    "MPLCONFIGDIR": "/tmp/matplotlib",
    "KERAS_HOME": "/tmp/keras",
    "XDG_CACHE_HOME": "/tmp/cache",
    "IOTGW_SERVING__CACHE_DIR": "/tmp/iotgw",
}
DEADLINE_S = 120.0


@dataclass
class Service:
    """One service of the compose file, its container's filesystem under ``root``."""

    name: str
    spec: dict[str, Any]
    root: Path
    port: int  # the free 127.0.0.1 port standing for its first published container port
    process: subprocess.Popen[bytes] | None = None
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.root.parent / f"{self.name}.log"

    @property
    def container_port(self) -> int:
        """The published container port ``port`` stands for: the first listed (a gateway's
        HTTP port; its gRPC port takes a free one, ``gateway_environment``)."""
        published = self.spec["ports"][0]
        return int(str(published).rsplit(":", 1)[-1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def path(self, container_path: str) -> str:
        """Where a path of the container lies here (a trailing slash kept: Mosquitto's
        persistence_location needs it)."""
        return f"{self.root}{container_path}"

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@dataclass
class Stack:
    folder: Path
    compose: dict[str, Any]
    services: dict[str, Service]

    def address(self, value: str) -> str:
        """``value`` with every ``<service>:<container port>`` replaced by its local address."""
        for s in self.services.values():
            value = value.replace(f"{s.name}:{s.container_port}", f"127.0.0.1:{s.port}")
        return value

    def secret_file(self, name: str) -> Path:
        return self.folder / self.compose["secrets"][name]["file"]

    def gateways(self) -> list[Service]:
        return [s for s in self.services.values() if s.spec.get("image") == "iotgw:latest"]


def plan(folder: Path) -> Stack:
    """Every service of the compose file but Grafana (not installable here)."""
    compose = load_one(COMPOSE)
    services = {
        name: Service(name, spec, folder / name / "root", free_port())
        for name, spec in compose["services"].items()
        if not spec["image"].startswith("grafana/")
    }
    return Stack(folder, compose, services)


def make_secrets(stack: Stack, devices: dict[str, str]) -> None:
    """The README's recipe: a random token or password in each secret file, and the broker's
    password file made with mosquitto_passwd: one account per gateway replica (its user name
    and its password file from the compose file) and one per device."""
    accounts = dict(devices)
    (stack.folder / "secrets").mkdir(parents=True)
    for gateway in stack.gateways():
        env = gateway.spec["environment"]
        secret = Path(env["IOTGW_MQTT__PASSWORD_FILE"]).name
        accounts[env["IOTGW_MQTT__USERNAME"]] = token = secrets.token_urlsafe(24)
        stack.secret_file(secret).write_text(token + "\n")
    for name in stack.compose["secrets"]:
        path = stack.secret_file(name)
        if path.name.endswith(".passwd"):
            path.touch()
            tool = program("mosquitto_passwd")
            for user, password_text in accounts.items():
                subprocess.run([tool, "-b", str(path), user, password_text], check=True)
        elif not path.exists():
            path.write_text(secrets.token_urlsafe(24) + "\n")


def mount(stack: Stack, service: Service) -> None:
    """Copy into the service's root what the compose file mounts into its container."""
    service.root.mkdir(parents=True)
    for entry in service.spec.get("secrets", []):
        source = entry if isinstance(entry, str) else entry["source"]
        target = f"/run/secrets/{source}" if isinstance(entry, str) else entry["target"]
        _copy(stack.secret_file(source), Path(service.path(target)))
    for volume in service.spec.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("./"):
            _copy(DEPLOY / source, Path(service.path(target)))
        else:  # a named volume: empty at first
            Path(service.path(target)).mkdir(parents=True, exist_ok=True)
    for target in service.spec.get("tmpfs", []):
        Path(service.path(target)).mkdir(parents=True, exist_ok=True)


def _copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        shutil.copytree(source, target)
    else:
        shutil.copyfile(source, target)


def localise_mosquitto(service: Service) -> None:
    """Its mounted configuration files with the listener on the local port of 127.0.0.1 and
    every path under the service's root; the main one also keeps the broker this user (run as
    root, Mosquitto would become user "mosquitto", who cannot read the test's folders)."""
    main = service.path(IMAGE_COMMANDS[service.spec["image"]][2])
    for volume in service.spec["volumes"]:
        target = Path(service.path(volume.split(":")[1]))
        if target.suffix != ".conf":
            continue
        conf = target.read_text()
        local = {"listener": f"{service.port} 127.0.0.1"}
        for line in conf.splitlines():
            words = line.split()
            if len(words) == 2 and not line.startswith("#") and words[1].startswith("/"):
                local[words[0]] = service.path(words[1])
        conf = localise(conf, local)
        if str(target) == main:
            conf += f"user {getpass.getuser()}\n"
        target.write_text(conf)


def localise_prometheus(stack: Stack, service: Service) -> None:
    """Its scrape targets at the gateways' local addresses and its token file in its root;
    everything else as shipped."""
    (config_file,) = (a for a in IMAGE_COMMANDS[service.spec["image"]] if "--config.file=" in a)
    path = Path(service.path(config_file.partition("=")[2]))
    config = yaml.safe_load(path.read_text())
    for job in config["scrape_configs"]:
        for group in job.get("static_configs", []):
            group["targets"] = [stack.address(t) for t in group["targets"]]
        authorization = job.get("authorization", {})
        if "credentials_file" in authorization:
            authorization["credentials_file"] = service.path(authorization["credentials_file"])
    path.write_text(yaml.safe_dump(config, sort_keys=False))


def command(service: Service) -> list[str]:
    """The image's command, its program found here and its absolute paths under the root."""
    name, *args = IMAGE_COMMANDS[service.spec["image"]]
    binary = mosquitto_binary() if name == "mosquitto" else program(name)
    local = []
    for arg in args:
        flag, eq, value = arg.partition("=")
        if eq and value.startswith("/"):
            arg = f"{flag}={service.path(value)}"
        elif arg.startswith("/"):
            arg = service.path(arg)
        local.append(arg)
    if name == "prometheus":  # the image listens on 0.0.0.0:9090
        local.append(f"--web.listen-address=127.0.0.1:{service.port}")
    return [binary, *local]


def gateway_environment(stack: Stack, service: Service, repo: Path) -> dict[str, str]:
    """This machine's environment without IOTGW_* (as in the image), the image's own
    variables, the compose file's, translated; the demo repository is ``repo``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("IOTGW_")}
    env.update({k: service.path(v) for k, v in IOTGW_IMAGE_ENV.items()})
    env["IOTGW_SERVING__MODEL_REPO"] = str(repo)
    env["IOTGW_HTTP__PORT"] = str(service.port)  # the image serves on its default, 8080
    # and gRPC on 8001: in its own network namespace; here the replicas share one host, so
    # each takes a free port.
    env["IOTGW_GRPC__PORT"] = "0"
    for key, value in service.spec["environment"].items():
        value = stack.address(str(value))
        if value == "0.0.0.0":
            value = "127.0.0.1"
        elif value.startswith("/"):
            value = service.path(value)
        env[key] = value
    return env


def start(service: Service, env: dict[str, str] | None = None) -> None:
    with service.log.open("wb") as out:
        service.process = subprocess.Popen(
            command(service), stdout=out, stderr=subprocess.STDOUT, env=env
        )


def wait_until_ok(service: Service, url: str) -> None:
    """Until ``url`` answers 200; fails at once when the service exits."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        assert service.process is not None
        if service.process.poll() is not None:
            raise AssertionError(f"{service.name} exited:\n{service.text()}")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{service.name} not ready in {DEADLINE_S} s:\n{service.text()}")
        time.sleep(0.1)


def wait_listening(service: Service) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while True:
        assert service.process is not None
        if service.process.poll() is not None:
            raise AssertionError(f"{service.name} exited:\n{service.text()}")
        try:
            with socket.create_connection(("127.0.0.1", service.port), timeout=0.2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise AssertionError(f"{service.name} not listening:\n{service.text()}") from None
            time.sleep(0.05)


def stop(services: list[Service]) -> None:
    """SIGTERM to all at once (the gateways drain), then wait; what outlives the wait is
    killed."""
    running = [s.process for s in services if s.process is not None]
    for p in running:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in running:
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@contextlib.contextmanager
def running_stack(folder: Path, repo: Path, devices: dict[str, str]) -> Iterator[Stack]:
    """Mosquitto, the gateway replicas and Prometheus, each ready (Prometheus not yet
    necessarily scraped), stopped on the way out in the reverse order of their start."""
    stack = plan(folder)
    make_secrets(stack, devices)
    for service in stack.services.values():
        mount(stack, service)
    broker = stack.services["mosquitto"]
    prometheus = stack.services["prometheus"]
    localise_mosquitto(broker)
    localise_prometheus(stack, prometheus)
    started: list[Service] = []
    try:
        start(broker)
        started.append(broker)
        wait_listening(broker)
        for gateway in stack.gateways():
            start(gateway, gateway_environment(stack, gateway, repo))
            started.append(gateway)
        for gateway in stack.gateways():
            wait_until_ok(gateway, gateway.url + "/v2/health/ready")
        start(prometheus)
        started.append(prometheus)
        wait_until_ok(prometheus, prometheus.url + "/-/ready")
        yield stack
    finally:
        for group in ([prometheus], stack.gateways(), [broker]):
            stop([s for s in group if s in started])


def prometheus_api(stack: Stack, path: str, **params: str) -> Any:
    """The ``data`` of a Prometheus HTTP API answer; fails on an error answer."""
    query = urllib.parse.urlencode(params)
    url = f"{stack.services['prometheus'].url}/api/v1/{path}" + (f"?{query}" if query else "")
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.loads(r.read())
    except urllib.error.HTTPError as exc:
        body = json.loads(exc.read())
    assert body["status"] == "success", f"{path} {params}: {body}"
    return body["data"]
