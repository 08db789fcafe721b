#!/usr/bin/env bash
# The compose stack for real: builds the images and runs `--profile local` with 3 workers and
# JetStream on, on this machine's own Docker engine, then checks what docs/compose.md promises.
# Every compose command of docs/compose.md runs here as written (the `docs:` lines).
#
#   1. engine    installs docker.io/iptables/nftables/debootstrap (apt) and Compose v2 (built from
#                its Go module) when missing; starts dockerd only if none is running
#                (scripts/container-engine.sh).
#   2. bases     pulls the base images, or builds stand-ins under the same tags from Debian
#                packages when no registry is reachable, and says so (scripts/base-images.sh).
#   3. build     `--profile local build` (timed), then `--profile cpu build` and `--profile gpu
#                build` (every image up to TEI's, which is pulled, not built).
#   4. up        `up -d --wait --scale worker-local=3` while a poller POSTs /embed every 100 ms:
#                the first request the gateway answers must be a 200 (time to it is reported).
#   5. checks    /embed with curl; a direct NATS request (examples/direct_nats.py, nats-py);
#                JetStream on with its store on the nats-data volume; the metrics example; 300
#                requests spread over the 3 workers (each worker's own /metrics);
#                scale 3 -> 1 -> 3 under a steady 20 req/s trickle with 0 errors.
#   6. bulk      a 1,500-line bulk job (OpenAI's Files + Batches API) completes across a kill -9
#                of a worker container, each custom_id once (scripts/checks/bulk_job.py).
#   7. observe   `--profile observe` adds Prometheus: every target (gateway, each of the 3
#                workers, itself) is up; after 20 s of traffic (new and repeated inputs, one input
#                twice, OpenAI's route) beside a 200-line bulk job, every query of the Grafana
#                dashboard returns numbers, fault-only ones at their zero fallback; the alerts
#                loaded and evaluate without error (scripts/checks/observe.py); then `down -v`.
#   8. models    two real models: fetches bge-small-en-v1.5 on the host (scripts/fetch-model.sh,
#                Maven), adds `--profile bge`, and checks that /v1/models lists both, that the
#                OpenAI `model` field reaches bge and TEI's /embed MiniLM (each against its
#                reference vectors in testdata/), then `down -v` of both profiles.
#   9. down      `down -v` leaves no container, network or volume of the project.
#  10. docs      every `docker compose` and `curl` command in the fenced blocks of docs/compose.md
#                and in compose.yaml's comments is one this script ran as written (doc_files).
# On exit (trap, also on failure or Ctrl-C): `down -v`, then the dockerd this script started is
# stopped by its PID and the links, nft tables and ip_forward it changed are put back.
#
# Usage: scripts/compose-e2e.sh          (.ci/run runs it last; CI=true adds nothing special)
# Env: GATEWAY_PORT, NATS_MONITOR_PORT, PROMETHEUS_PORT (host ports; free ones are picked when
#      8080/8222/9090 are busy), E2E_TRICKLE_RATE (req/s, 20). Prints a summary; exits non-zero when any check fails.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
# shellcheck source=scripts/container-engine.sh
source scripts/container-engine.sh

started=$SECONDS
failures=0
summary=()
tmp=$(mktemp -d)
step() { printf '\n==> %s (%ds)\n' "$*" "$((SECONDS - started))"; }
ok() { echo "ok    $*"; }
fail() { echo "FAIL  $*"; failures=$((failures + 1)); }
note() { summary+=("$*"); echo "      $*"; }
# docs: CMD... runs a command exactly as docs/compose.md shows it (echoed on stderr with that
# prefix; its stdout stays its own).
docs() {
  local arg shown=
  for arg in "$@"; do
    if [[ $arg =~ ^[A-Za-z0-9_./:=@,+-]+$ ]]; then shown+=" $arg"; else shown+=" '${arg//\'/\'\\\'\'}'"; fi
  done
  echo "docs:$shown" >&2
  # A file, not a variable: docs also runs inside $(...).
  echo "${shown# }" >>"$tmp/ran"
  "$@"
}
# The files whose compose commands must all be among those run here (scripts/checks/doc_commands.py).
doc_files=(README.md docs/compose.md compose.yaml)

project_up=0
cleanup() {
  local status=$?
  set +e
  trap - EXIT INT TERM
  if ((project_up)); then
    if ((status != 0 || failures > 0)); then
      echo "--- the stack's last log lines"
      docker compose --profile local --profile bge --profile observe logs --no-color --tail 40 2>&1 | tail -n 160
    fi
    echo "cleanup: docker compose --profile local --profile bge --profile observe down -v"
    docker compose --profile local --profile bge --profile observe down -v --remove-orphans >/dev/null 2>&1
  fi
  engine_stop
  rm -rf "$tmp"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# report CMD...: runs a check program of scripts/checks that prints "ok MSG", "fail MSG" or
# "info MSG" lines, and counts them; a non-zero exit without a "fail" line is a failure too.
report() {
  local line status=0 out
  out=$("$@" 2>&1) || status=$?
  while IFS= read -r line; do
    case $line in
      ok\ *) ok "${line#ok }" ;;
      fail\ *) fail "${line#fail }" ;;
      info\ *) echo "      ${line#info }" ;;
      *) [[ -z $line ]] || echo "      $line" ;;
    esac
  done <<<"$out"
  ((status == 0)) || grep -q '^fail ' <<<"$out" || fail "$*: exited with status $status"
  printf '%s\n' "$out" >"$tmp/report.out"
}

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port_busy() { python3 -c "import socket,sys; s=socket.socket(); sys.exit(s.connect_ex(('127.0.0.1', $1)) != 0)"; }

# ---------------------------------------------------------------------------------------------
step "1. container engine"
engine_install
compose_install
engine_start
echo "docker $(docker version --format '{{.Server.Version}}'), $(docker compose version)"
# A stack left over from an interrupted run would be reused by `up`.
docker compose --profile local --profile bge --profile cpu --profile observe down -v --remove-orphans >/dev/null 2>&1 || true

step "2. base images"
scripts/base-images.sh 2>&1 | tee "$tmp/bases.log"
if grep -q 'STAND-IN' "$tmp/bases.log"; then
  note "base images: no registry reachable, so STAND-INS built from Debian packages (scripts/base-images.sh) were used"
else
  note "base images: the official ones"
fi

step "3. images"
t=$SECONDS
docs docker compose --profile local build
note "build (--profile local): $((SECONDS - t)) s"
t=$SECONDS
docs docker compose --profile cpu build
docs docker compose --profile gpu build
note "build (--profile cpu, then gpu; up to the TEI image): $((SECONDS - t)) s"
for image in gateway worker worker-local; do
  size=$(docker image inspect -f '{{.Size}}' "embatch/$image:dev" | awk '{printf "%.0f", $1/1e6}')
  note "image embatch/$image:dev: $size MB"
done
# The binaries as the images carry them: copied out of a created (never started) container.
for bin in embatch-gateway embatch-worker; do
  image=gateway
  [[ $bin == embatch-worker ]] && image=worker
  cid=$(docker create "embatch/$image:dev")
  docker cp -q "$cid:/usr/local/bin/$bin" "$tmp/$bin" && docker rm -f "$cid" >/dev/null
  mb=$(($(stat -c %s "$tmp/$bin") / 1000000))
  extra=$(python3 scripts/checks/elf_sections.py "$tmp/$bin" | grep -E '^\.(debug_|symtab$)' | tr '\n' ' ' || true)
  if [[ -z $extra ]]; then
    ok "$bin in embatch/$image:dev: $mb MB, no .debug_* sections, no .symtab"
  else
    fail "$bin in embatch/$image:dev carries $extra"
  fi
  note "binary $bin: $mb MB"
done

step "4. up: --profile local, 3 workers, JetStream on"
if port_busy "${GATEWAY_PORT:-8080}"; then
  export GATEWAY_PORT=$(free_port)
  echo "port 8080 is busy here: GATEWAY_PORT=$GATEWAY_PORT"
fi
if port_busy "${NATS_MONITOR_PORT:-8222}"; then
  export NATS_MONITOR_PORT=$(free_port)
  echo "port 8222 is busy here: NATS_MONITOR_PORT=$NATS_MONITOR_PORT"
fi
if port_busy "${PROMETHEUS_PORT:-9090}"; then
  PROMETHEUS_PORT=$(free_port)
  export PROMETHEUS_PORT
  echo "port 9090 is busy here: PROMETHEUS_PORT=$PROMETHEUS_PORT"
fi
gw=localhost:${GATEWAY_PORT:-8080}
monitor=127.0.0.1:${NATS_MONITOR_PORT:-8222}
prom=localhost:${PROMETHEUS_PORT:-9090}
python3 scripts/checks/traffic.py first200 "http://$gw/embed" 300 >"$tmp/first200.json" &
poller=$!
project_up=1
t=$SECONDS
docs docker compose --profile local up -d --wait --scale worker-local=3
note "up -d --wait with 3 workers: $((SECONDS - t)) s"
wait "$poller" || true
first=$(cat "$tmp/first200.json")
echo "poller: $first"
read -r first_s others < <(python3 -c '
import json, sys
r = json.loads(sys.argv[1])
print(r["first_200_s"], sum(n for s, n in r["answered"].items() if s != "200"))' "$first")
if [[ $first_s != None && $others == 0 ]]; then
  ok "the first request the gateway answered got 200, ${first_s} s after up started"
  note "up to the first 200: ${first_s} s (polling every 100 ms; no answer other than 200 before it)"
else
  fail "ready when it can serve: $first"
fi
docker compose --profile local ps --format '{{.Service}} {{.State}} {{.Health}}' | sort | uniq -c

step "5. checks"
embed=$(docs curl -s "$gw/embed" -H 'Content-Type: application/json' -d '{"inputs":"hello"}')
dims=$(python3 -c 'import json,sys; v=json.loads(sys.argv[1]); print(len(v[0]) if isinstance(v, list) and len(v) == 1 else -1)' "$embed" 2>/dev/null || echo -1)
if [[ $dims == 384 ]]; then ok "/embed over HTTP: one vector of 384 floats"; else fail "/embed over HTTP: ${embed:0:200}"; fi
# The README's example, as written.
embed=$(docs curl -s "$gw/embed" -H 'Content-Type: application/json' -d '{"inputs": ["What is vector search?", "Hello, world!"], "normalize": true}')
dims=$(python3 -c 'import json,sys; v=json.loads(sys.argv[1]); print(",".join(str(len(x)) for x in v) if isinstance(v, list) else -1)' "$embed" 2>/dev/null || echo -1)
if [[ $dims == 384,384 ]]; then ok "/embed over HTTP (the README's example): two vectors of 384 floats"; else fail "/embed over HTTP (the README's example): ${embed:0:200}"; fi

# Direct NATS: the client port is published on the compose network only, so the host reaches the
# nats container's address on the project's own bridge network.
nats_ip=$(docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$(docker compose --profile local ps -q nats)")
venv=${XDG_CACHE_HOME:-$HOME/.cache}/embatch/client-venv
if ! "$venv/bin/python" -c 'import nats' 2>/dev/null; then
  venv=${XDG_CACHE_HOME:-$HOME/.cache}/embatch/nats-venv
  if ! "$venv/bin/python" -c 'import nats' 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "$(grep '^nats-py==' tests/clients/requirements.txt)"
  fi
fi
if out=$("$venv/bin/python" examples/direct_nats.py "nats://$nats_ip:4222" "hello over NATS" 2>&1) &&
  grep -q '384 dims' <<<"$out"; then
  ok "direct NATS request (examples/direct_nats.py to nats://$nats_ip:4222): $out"
else
  fail "direct NATS request: $out"
fi

jsz=$(curl -s "$monitor/jsz" || true)
store=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["config"]["store_dir"])' "$jsz" 2>/dev/null || echo "(JetStream off)")
mounted=$(docker inspect -f '{{range .Mounts}}{{if eq .Destination "/data"}}{{.Type}}:{{.Name}}{{end}}{{end}}' \
  "$(docker compose --profile local ps -q nats)")
if [[ $store == /data/* && $mounted == volume:embatch_nats-data ]]; then
  ok "JetStream on (/jsz), store $store on the volume embatch_nats-data"
else
  fail "JetStream: store $store, /data is ${mounted:-not mounted}"
fi

metrics=$(docs docker compose exec gateway curl -s worker-local:9091/metrics)
# Any worker series: the replica that answers may not have served a request yet (three
# replicas, a handful of requests so far), and a counter appears at its first increment.
if grep -q '^embatch_worker_' <<<"$metrics"; then
  ok "the metrics example answers with the worker's Prometheus metrics"
else
  fail "the metrics example: ${metrics:0:300}"
fi

# Load spread: every worker's own counter, read from its address on the compose network.
worker_ok() {
  local id ip
  for id in $(docker compose --profile local ps -q worker-local); do
    ip=$(docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$id")
    curl -s "$ip:9091/metrics" | awk -v id="${id:0:12}" '
      /^embatch_worker_requests_total\{.*outcome="ok"/ { n += $NF }
      END { printf "%s %d\n", id, n }'
  done | sort
}
worker_ok >"$tmp/before"
burst=$(python3 scripts/checks/traffic.py burst "http://$gw/embed" 300 8)
worker_ok >"$tmp/after"
spread=$(join "$tmp/before" "$tmp/after" | awk '{print $3 - $2}' | tr '\n' ' ')
echo "300 requests, 8 at a time: $burst; per worker: $spread"
if python3 - "$burst" $spread <<'EOF'; then
import json, sys
burst = json.loads(sys.argv[1])
per = [int(x) for x in sys.argv[2:]]
# Each of the 3 workers took a fair part: at least a sixth of the requests (an even split is a third).
sys.exit(not (burst["ok"] == 300 and len(per) == 3 and sum(per) == 300 and min(per) >= 50))
EOF
  ok "load spread over the 3 workers: $spread(of 300)"
  note "load spread, 300 requests: $spread"
else
  fail "load spread: $spread; $burst"
fi

rate=${E2E_TRICKLE_RATE:-20}
rm -f "$tmp/stop"
python3 scripts/checks/traffic.py trickle "http://$gw/embed" "$rate" "$tmp/stop" >"$tmp/trickle.json" &
trickler=$!
sleep 3
t=$SECONDS
docs docker compose --profile local up -d --wait --scale worker-local=1
down_s=$((SECONDS - t))
sleep 3
t=$SECONDS
docs docker compose --profile local up -d --wait --scale worker-local=3
up_s=$((SECONDS - t))
sleep 3
touch "$tmp/stop"
wait "$trickler" || true
trickle=$(cat "$tmp/trickle.json")
errors=$(python3 -c 'import json,sys; r=json.loads(sys.argv[1]); print(sum(r["errors"].values()), r["sent"])' "$trickle")
read -r nerr nsent <<<"$errors"
if ((nerr == 0 && nsent > 0)) && [[ $(docker compose --profile local ps -q worker-local | wc -l) == 3 ]]; then
  ok "scale 3 -> 1 ($down_s s) -> 3 ($up_s s) under $rate req/s: $nsent requests, 0 errors ($trickle)"
else
  fail "scale 3 -> 1 -> 3 under $rate req/s: $trickle"
fi
note "scale 3 -> 1 -> 3 under $rate req/s: $nerr errors of $nsent requests"

step "6. bulk lane"
# 1,500 one-input lines through OpenAI's Files + Batches API; once a tenth is done, one of the 3
# worker containers is killed (SIGKILL): what it held is redelivered after BULK_ACK_WAIT.
# sed, not head: head exits after one line, and under pipefail the compose CLI's write to the
# closed pipe would end the script.
victim=$(docker compose --profile local ps -q worker-local | sed -n 1p)
if bulk=$(python3 scripts/checks/bulk_job.py "http://$gw" 1500 "docker kill $victim >/dev/null" 240); then
  ok "a bulk job of 1,500 lines completed across a worker kill -9, each custom_id once: $bulk"
else
  fail "bulk job across a worker kill: $bulk"
fi
note "bulk job across a worker kill: $bulk"
docker compose --profile local up -d --wait --scale worker-local=3 >/dev/null

step "7. observe: Prometheus beside the stack (--profile observe)"
t=$SECONDS
docs docker compose --profile local --profile observe up -d --wait --scale worker-local=3
note "up -d --wait adding Prometheus: $((SECONDS - t)) s"
# The first scrapes, and Docker's DNS listing the 3 replicas of worker-local.
report python3 scripts/checks/observe.py targets "http://$prom" 3 60
# The docs' examples, as written: each answers with data.
answered() { python3 -c 'import json, sys; r = json.loads(sys.argv[1])["data"]; sys.exit(not (r.get("activeTargets") or r.get("result")))' "$1" 2>/dev/null; }
out=$(docs curl -s "$prom/api/v1/targets")
if answered "$out"; then ok "the docs' targets example lists the targets"; else fail "the docs' targets example: ${out:0:300}"; fi
# Traffic while Prometheus scrapes every 5 s: the rates, quantiles and ratios need samples that
# grow within the dashboard's rate window. The bulk job feeds the bulk panels (no fault: `true`).
python3 scripts/checks/bulk_job.py "http://$gw" 200 true 120 >"$tmp/observe-bulk.json" 2>&1 &
bulker=$!
if traffic=$(python3 scripts/checks/observe.py traffic "http://$gw" 20); then
  ok "observe traffic: $traffic"
else
  fail "observe traffic: $traffic"
fi
if wait "$bulker"; then ok "observe bulk job: $(cat "$tmp/observe-bulk.json")"; else fail "observe bulk job: $(cat "$tmp/observe-bulk.json")"; fi
# Two scrapes and a rule evaluation after the traffic; a 1m window still holds all of it, as
# Grafana's $__rate_interval does with its default 15 s scrape interval.
sleep 11
report python3 scripts/checks/observe.py dashboard "http://$prom" deploy/grafana/embatch.json 1m
note "observe: $(sed -n 's/^ok dashboard: //p' "$tmp/report.out")"
report python3 scripts/checks/observe.py rules "http://$prom" deploy/prometheus/embatch-rules.yaml
out=$(docs curl -s "$prom/api/v1/query" --data-urlencode 'query=sum by (model) (rate(embatch_worker_requests_total[1m]))')
if answered "$out"; then ok "the docs' query example: ${out:0:200}"; else fail "the docs' query example: ${out:0:300}"; fi
docs docker compose --profile local --profile observe down -v

step "8. two models: MiniLM (the default) and bge-small-en-v1.5 (--profile bge)"
t=$SECONDS
scripts/fetch-model.sh --model bge-small-en-v1.5 >/dev/null
note "fetch of bge-small-en-v1.5 on the host: $((SECONDS - t)) s"
t=$SECONDS
docs docker compose --profile local --profile bge up -d --wait
note "up -d --wait adding the bge workers: $((SECONDS - t)) s"
models=$(docs curl -s "$gw/v1/models")
bge=$(docs curl -s "$gw/v1/embeddings" -H 'Content-Type: application/json' -d '{"model": "bge-small-en-v1.5", "input": "What is vector search?"}')
minilm=$(docs curl -s "$gw/embed" -H 'Content-Type: application/json' -d '{"inputs": "What is vector search?"}')
if out=$(python3 - "$models" "$bge" "$minilm" 2>&1 <<'EOF'
import json, math, sys
text = "What is vector search?"
models, bge, minilm = (json.loads(a) for a in sys.argv[1:4])
ids = sorted(m["id"] for m in models["data"])
assert "all-MiniLM-L6-v2" in ids and "bge-small-en-v1.5" in ids, f"/v1/models lists {ids}"
bge, minilm = bge["data"][0]["embedding"], minilm[0]

def reference(name):
    for case in json.load(open(f"testdata/{name}"))["cases"]:
        if text in case["request"]["inputs"]:
            return case["embeddings"][case["request"]["inputs"].index(text)]
    raise SystemExit(f"{text!r} is not in testdata/{name}")

def cos(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))

want_bge = reference("bge-small-reference-embeddings.json")
want_minilm = reference("minilm-reference-embeddings.json")
got = {"bge": cos(bge, want_bge), "minilm": cos(minilm, want_minilm), "crossed": cos(bge, want_minilm)}
assert len(bge) == len(minilm) == 384, f"{len(bge)} and {len(minilm)} values"
assert got["bge"] >= 0.999 and got["minilm"] >= 0.999, f"cosines with the references: {got}"
print(f"/v1/models lists {ids}; cosine with its reference: bge {got['bge']:.5f}, MiniLM "
      f"{got['minilm']:.5f} (bge vs MiniLM's reference {got['crossed']:.3f})")
EOF
); then
  ok "two models behind one gateway: $out"
  note "two models: $out"
else
  fail "two models: $out; /v1/models ${models:0:200}; bge ${bge:0:120}; /embed ${minilm:0:120}"
fi
docs docker compose --profile local --profile bge down -v

step "9. down"
docs docker compose --profile local down -v
project_up=0
left=$(
  docker ps -aq --filter label=com.docker.compose.project=embatch
  docker network ls -q --filter label=com.docker.compose.project=embatch
  docker volume ls -q --filter label=com.docker.compose.project=embatch
)
if [[ -z $left ]]; then
  ok "down -v left no container, network or volume of the project"
else
  fail "down -v left: $left"
fi

step "10. the docs' commands"
missing=0
while IFS=$'\t' read -r file command; do
  found=0
  grep -qxF -- "$command" "$tmp/ran" && found=1
  # The gateway's host port differs only when 8080 was busy here.
  [[ $found == 0 && -n ${GATEWAY_PORT:-} && $command == *localhost:8080* ]] && found=1
  [[ $found == 0 && -n ${PROMETHEUS_PORT:-} && $command == *localhost:9090* ]] && found=1
  if ((found == 0)); then
    fail "$file shows \`$command\`, which this test does not run as written"
    missing=$((missing + 1))
  fi
done < <(python3 scripts/checks/doc_commands.py "${doc_files[@]}")
((missing == 0)) && ok "every compose and curl command of ${doc_files[*]} ran here as written"

echo
echo "compose-e2e summary ($((SECONDS - started)) s in all):"
printf '  %s\n' "${summary[@]}"
if ((failures)); then
  echo "compose-e2e: $failures check(s) failed"
  exit 1
fi
echo "compose-e2e: all checks passed"
