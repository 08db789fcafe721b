#!/usr/bin/env python3
"""Checks compose.yaml as Compose itself renders it (`docker compose config --format json`):

- it renders for every supported profile set (none, gpu, cpu, local, gpu+local, cpu+local,
  local+bge, local+observe), once
  with .env.example, once with .env if there is one and once with no env file at all (compose.yaml's
  own defaults), and each profile set enables exactly the expected services; an env file's own
  COMPOSE_PROFILES, if set, renders too;
- as rendered with each env file, the services are wired as intended: scalable workers, health
  checks, depends_on, GPU reservation, grace periods vs timeouts, TEI batch cap, ...

Which variables compose.yaml sets and their defaults (vs .env.example and the binaries' flags) are
checked by gateway/tests/deploy_files.rs.

Usage: compose.py COMPOSE_CMD...   e.g. compose.py docker compose
Prints "ok MSG" / "fail MSG" / "info MSG" per line (Python 3 stdlib only); exits 1 on a failure.
"""
import json
import os
import re
import subprocess
import sys

import outcome
from outcome import check, info

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

# Profile sets that make sense, and the services each must enable.
PROFILE_SETS = {
    (): "gateway nats",
    ("gpu",): "gateway nats tei-gpu worker",
    ("cpu",): "gateway nats tei-cpu worker",
    ("local",): "gateway nats worker-local",
    ("gpu", "local"): "gateway nats tei-gpu worker worker-local",
    ("cpu", "local"): "gateway nats tei-cpu worker worker-local",
    ("local", "bge"): "gateway nats worker-bge worker-local",
    ("local", "observe"): "gateway nats prometheus worker-local",
}
# The sets whose services together cover every service; the structure checks read these.
STRUCTURE_SETS = (("gpu", "local"), ("cpu", "local"), ("local", "bge"))
# Every worker service.
WORKERS = ("worker", "worker-local", "worker-bge")


# ---------------------------------------------------------------------------------------------
# Running Compose

def compose(cmd, env_file, profiles, *args, env_profiles=False):
    """Runs Compose on compose.yaml with a clean environment, so that variables exported in the
    caller's shell don't leak into the interpolation: only the env file decides. COMPOSE_PROFILES
    is set empty so that only the --profile flags select profiles, even when the env file sets
    COMPOSE_PROFILES (Compose prefers the process environment); env_profiles=True leaves it out."""
    env = {k: os.environ[k] for k in ("PATH", "HOME", "DOCKER_CONFIG") if k in os.environ}
    if not env_profiles:
        env["COMPOSE_PROFILES"] = ""
    argv = [*cmd, "--project-directory", ROOT, "-f", os.path.join(ROOT, "compose.yaml"),
            "--env-file", env_file]
    for p in profiles:
        argv += ["--profile", p]
    return subprocess.run([*argv, *args], env=env, capture_output=True, text=True)


def render(cmd, env_file, profiles, label, env_profiles=False):
    """The services as rendered (`config --format json`), or None after reporting a failure."""
    out = compose(cmd, env_file, profiles, "config", "--format", "json", env_profiles=env_profiles)
    if out.returncode != 0:
        check(False, f"{label}: docker compose config: {out.stderr.strip()}")
        return None
    if out.stderr.strip():
        info(f"{label}: warnings: {out.stderr.strip()}")
    return json.loads(out.stdout)["services"]


def env_files():
    """(tag, path): .env.example, .env if there is one, and no env file at all."""
    files = [("env.example", os.path.join(ROOT, ".env.example"))]
    if os.path.isfile(os.path.join(ROOT, ".env")):
        files.append(("env", os.path.join(ROOT, ".env")))
    return files + [("defaults", os.devnull)]


def shown(env_file):
    return env_file if env_file == os.devnull else os.path.relpath(env_file, ROOT)


def sets_compose_profiles(env_file):
    with open(env_file) as f:
        return any(re.match(r"\s*COMPOSE_PROFILES=", line) for line in f)


# ---------------------------------------------------------------------------------------------
# Profile sets

def profile_set_renders_expected_services(cmd, env_file, profiles):
    label = f"profiles=[{','.join(profiles) or 'none'}] env-file={shown(env_file)}"
    services = render(cmd, env_file, profiles, label)
    if services is None:
        return None
    got, want = " ".join(sorted(services)), PROFILE_SETS[profiles]
    check(got == want, f"{label}: services: {got}" if got == want
          else f"{label}: services are [{got}], expected [{want}]")
    return services


def env_file_profiles_render(cmd, env_file):
    label = f"COMPOSE_PROFILES from {shown(env_file)}"
    services = render(cmd, env_file, (), label, env_profiles=True)
    if services is not None:
        check(True, f"{label}: valid, services: {' '.join(sorted(services))}")


# ---------------------------------------------------------------------------------------------
# Structure: each check takes the services rendered from one env file (all profiles enabled).

def dur(s):
    """humantime-ish duration ('45s', '1m30s', '5ms') -> seconds."""
    units = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ns|us|ms|s|m|h)", str(s))
    if not parts or "".join(a + b for a, b in parts) != str(s).replace(" ", ""):
        raise ValueError(f"bad duration {s!r}")
    return sum(float(n) * units[u] for n, u in parts)


def workers_are_scalable(svc, check):
    for name in WORKERS:
        s = svc[name]
        check("container_name" not in s and not s.get("ports"),
              f"{name}: scalable (no container_name, no published ports)")


def workers_drain_before_sigkill(svc, check):
    for name in WORKERS:
        s, env = svc[name], svc[name].get("environment", {})
        check(dur(s.get("stop_grace_period", "10s")) > dur(env.get("SHUTDOWN_GRACE", "30s")),
              f"{name}: stop_grace_period {s.get('stop_grace_period')} > SHUTDOWN_GRACE {env.get('SHUTDOWN_GRACE')}")


def workers_wait_for_healthy_nats(svc, check):
    for name in WORKERS:
        dep = svc[name].get("depends_on", {}).get("nats", {})
        check(dep.get("condition") == "service_healthy" and dep.get("required", True),
              f"{name}: depends on nats being healthy")


def every_service_has_health_check(svc, check):
    for name, s in sorted(svc.items()):
        hc = s.get("healthcheck", {})
        check(bool(hc.get("test")) and not hc.get("disable"), f"{name}: has a health check")


def workers_upstreams(svc, check):
    check(svc["worker"]["environment"].get("TEI_URL") == "http://tei:80", "worker: TEI_URL=http://tei:80")
    check("TEI_URL" not in svc["worker-local"]["environment"], "worker-local: no TEI_URL (built-in model)")
    check("TEI_URL" not in svc["worker-bge"]["environment"], "worker-bge: no TEI_URL (built-in model)")


def second_model_is_mounted_and_not_default(svc, check):
    s, env = svc["worker-bge"], svc["worker-bge"]["environment"]
    mounts = [v for v in s.get("volumes", []) if v.get("target") == env.get("MODEL_DIR")]
    check(len(mounts) == 1 and mounts[0].get("type") == "bind" and mounts[0].get("read_only")
          and not mounts[0].get("bind", {}).get("create_host_path", False)
          and mounts[0].get("source", "").endswith("/models/bge-small-en-v1.5"),
          "worker-bge: MODEL_DIR is ./models/bge-small-en-v1.5, bound read-only, never created empty")
    default, name = env.get("EMBATCH_DEFAULT_MODEL"), os.path.basename(env.get("MODEL_DIR", ""))
    check(bool(default) and default != name and not env.get("MODEL_ALIAS"),
          f"worker-bge: serves {name}, not the default model ({default}): never the plain subject")
    dep = svc["gateway"]["depends_on"].get("worker-bge", {})
    check(dep.get("condition") == "service_healthy" and dep.get("required") is False,
          "gateway: waits for worker-bge when enabled (service_healthy, required: false)")


def dockerfile_target_per_service(svc, check):
    check(all(svc[name]["build"].get("target") == name for name in ("gateway", "worker", "worker-local")),
          "Dockerfile targets per service")


def worker_waits_for_enabled_tei(svc, check):
    for tei in ("tei-gpu", "tei-cpu"):
        dep = svc["worker"]["depends_on"].get(tei, {})
        check(dep.get("condition") == "service_healthy" and dep.get("required") is False,
              f"worker: waits for {tei} when enabled (service_healthy, required: false)")


def tei_images_pinned(svc, check):
    for tei in ("tei-gpu", "tei-cpu"):
        image = svc[tei]["image"]
        check(image.startswith("ghcr.io/huggingface/text-embeddings-inference:")
              and not image.endswith(":latest"), f"{tei}: pinned TEI image {image}")


def tei_answers_to_tei(svc, check):
    for tei in ("tei-gpu", "tei-cpu"):
        aliases = (svc[tei].get("networks", {}).get("default") or {}).get("aliases", [])
        check("tei" in aliases, f"{tei}: answers to the host name tei")


def tei_batch_cap_fits_worker(svc, check):
    env = svc["worker"]["environment"]
    need = max(int(env["MAX_BATCH_SIZE"]), int(env["MAX_CLIENT_BATCH_SIZE"]))
    for tei in ("tei-gpu", "tei-cpu"):
        got = int(svc[tei]["environment"]["MAX_CLIENT_BATCH_SIZE"])
        check(got >= need, f"{tei}: MAX_CLIENT_BATCH_SIZE {got} >= max(MAX_BATCH_SIZE, MAX_CLIENT_BATCH_SIZE) {need}")


def gpu_reservation_only_on_tei_gpu(svc, check):
    reservations = lambda s: s.get("deploy", {}).get("resources", {}).get("reservations", {})
    devices = reservations(svc["tei-gpu"]).get("devices", [])
    check(any("gpu" in d.get("capabilities", []) for d in devices), "tei-gpu: reserves GPU devices")
    check(not reservations(svc["tei-cpu"]), "tei-cpu: no device reservation")


def gateway_publishes_8080(svc, check):
    check(any(str(p.get("target")) == "8080" for p in svc["gateway"].get("ports", [])),
          "gateway: publishes 8080")


def gateway_timeouts_nest(svc, check):
    g, env = svc["gateway"], svc["gateway"]["environment"]
    check(dur(g["healthcheck"]["timeout"]) > dur(env.get("HEALTH_TIMEOUT", "1s")),
          f"gateway: health check timeout {g['healthcheck']['timeout']} > HEALTH_TIMEOUT {env.get('HEALTH_TIMEOUT')}")
    check(dur(g.get("stop_grace_period", "10s")) > dur(env.get("REQUEST_TIMEOUT", "30s")),
          f"gateway: stop_grace_period {g.get('stop_grace_period')} > REQUEST_TIMEOUT {env.get('REQUEST_TIMEOUT')}")


def gateway_and_workers_share_subject(svc, check):
    subjects = {svc[n]["environment"].get("EMBATCH_SUBJECT") for n in ("gateway", *WORKERS)}
    check(len(subjects) == 1, "gateway and workers share EMBATCH_SUBJECT")


def nats_service(svc, check):
    n = svc["nats"]
    # The minor of nats/VERSION (nats_configs.py checks compose.yaml's text and the Helm values).
    with open(os.path.join(ROOT, "nats", "VERSION")) as f:
        minor = f.read().strip().lstrip("v").rsplit(".", 1)[0]
    check(n["image"] == f"nats:{minor}-alpine",
          f"nats: image {n['image']} (want nats:{minor}-alpine, the minor of nats/VERSION)")
    check(any(v.get("target") == "/etc/nats/nats-server.conf" and v.get("source", "").endswith("/nats/nats.conf")
              for v in n.get("volumes", [])), "nats: mounts nats/nats.conf")
    check("/healthz" in " ".join(n["healthcheck"]["test"]), "nats: health check on /healthz")


STRUCTURE_CHECKS = (
    workers_are_scalable, workers_drain_before_sigkill, workers_wait_for_healthy_nats,
    every_service_has_health_check, workers_upstreams, second_model_is_mounted_and_not_default,
    dockerfile_target_per_service,
    worker_waits_for_enabled_tei, tei_images_pinned, tei_answers_to_tei, tei_batch_cap_fits_worker,
    gpu_reservation_only_on_tei_gpu, gateway_publishes_8080, gateway_timeouts_nest,
    gateway_and_workers_share_subject, nats_service,
)


def check_structure(tag, services):
    tagged = lambda good, msg: check(good, f"[{tag}] {msg}")
    for structure_check in STRUCTURE_CHECKS:
        try:
            structure_check(services, tagged)
        except (KeyError, TypeError, ValueError) as e:
            tagged(False, f"{structure_check.__name__}: {type(e).__name__}: {e}")


# ---------------------------------------------------------------------------------------------

def main():
    cmd = sys.argv[1:]
    if not cmd:
        sys.exit("usage: compose.py COMPOSE_CMD...")
    for tag, env_file in env_files():
        rendered = {p: profile_set_renders_expected_services(cmd, env_file, p) for p in PROFILE_SETS}
        if tag != "defaults" and sets_compose_profiles(env_file):
            env_file_profiles_render(cmd, env_file)
        if any(rendered[p] is None for p in STRUCTURE_SETS):
            check(False, f"[{tag}] structure: not checked, docker compose config failed above")
            continue
        services = {}
        for p in STRUCTURE_SETS:
            services.update(rendered[p])
        check_structure(tag, services)
    sys.exit(outcome.status())


if __name__ == "__main__":
    main()
