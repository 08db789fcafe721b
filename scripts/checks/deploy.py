#!/usr/bin/env python3
"""Checks of the Kubernetes and observability files that need no cluster (scripts/deploy-check.sh):

  metrics PROMTOOL   deploy/grafana/embatch.json is what deploy/grafana/generate.py writes, the
                     chart's copies of the dashboard and of deploy/prometheus/embatch-rules.yaml are
                     identical to them, and every metric the dashboard's queries and variables and
                     the rules' expressions name is one the gateway or the workers export (the
                     `pub const NAME: &str = "embatch_..."` names of their source; `_bucket`, `_sum`
                     and `_count` for histograms only); every dashboard query parses (promtool
                     check rules over them as recording rules); every alert has a promtool test in
                     which it fires and one in which it does not.
  env MANIFEST...    in rendered manifests, every environment variable of a `gateway` or `worker`
                     container is a variable of docs/configuration.md's tables for that binary
                     (its own, NATS connection's or Tracing's)
                     (or RUST_LOG, HF_HOME, HF_HUB_OFFLINE); and every `config` key of the chart's
                     values.yaml is such a variable, set to its default there.
  keda PROMTOOL MANIFEST TEMPLATE
                     the Prometheus queries of the ScaledObjects in MANIFEST, substituted for
                     ${trigger-name} in the promtool test file TEMPLATE, pass `promtool test rules`.
  fails MESSAGE_RE   reads helm's stderr on stdin: ok when it names MESSAGE_RE (a render that must
                     fail did, for the right reason).

Prints "ok MSG" / "fail MSG" / "info MSG" per check; exits non-zero on a failure. Needs PyYAML.
"""

import json
import os
import re
import subprocess
import sys
import tempfile

import yaml

import outcome
from outcome import check

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def read(rel):
    with open(os.path.join(ROOT, rel)) as f:
        return f.read()


# ------------------------------------------------------------------------------------------
# metrics
# ------------------------------------------------------------------------------------------

SOURCE_DIRS = [
    "gateway/src", "worker/src", "batcher/src", "bulk/src", "cache/src", "membership/src",
    "client/src", "runtime/src",
]
# The worker re-exports the batcher's, the bulk lane's, the cache's and the membership's metric
# names and describes them: one namespace.
SAME_NAMES = {"batcher": "worker", "bulk": "worker", "cache": "worker", "membership": "worker"}


def exported_metrics():
    """Metric names the binaries export: base names, and the series names of histograms."""
    names, consts, histograms = set(), {}, set()
    const_re = re.compile(r'pub const ([A-Z_]+): &str = "(embatch_[a-z0-9_]+)";')
    hist_re = re.compile(r'(?:describe_)?histogram!\(\s*(?:[a-z_]+::)*([A-Z_]+)')
    for d in SOURCE_DIRS:
        crate = d.split("/")[0]  # constants are resolved within their crate
        crate = SAME_NAMES.get(crate, crate)
        for base, _, files in os.walk(os.path.join(ROOT, d)):
            for file in files:
                if not file.endswith(".rs"):
                    continue
                with open(os.path.join(base, file)) as f:
                    text = f.read()
                for const, name in const_re.findall(text):
                    consts[crate, const] = name
                    names.add(name)
                histograms.update((crate, const) for const in hist_re.findall(text))
    series = set(names)
    for const in histograms:
        if const in consts:
            series.update(consts[const] + s for s in ("_bucket", "_sum", "_count"))
    return names, series


# PromQL words that are not metric names.
PROMQL_WORDS = set("""
sum min max avg group stddev stdvar count count_values bottomk topk quantile limitk limit_ratio
by without on ignoring group_left group_right bool and or unless offset
abs absent absent_over_time ceil changes clamp clamp_max clamp_min day_of_month day_of_week
day_of_year days_in_month delta deriv exp floor histogram_avg histogram_count histogram_fraction
histogram_quantile histogram_stddev histogram_stdvar histogram_sum holt_winters hour idelta
increase irate label_join label_replace ln log2 log10 minute month predict_linear rate resets
round scalar sgn sort sort_desc sort_by_label sort_by_label_desc sqrt time timestamp vector year
avg_over_time min_over_time max_over_time sum_over_time count_over_time quantile_over_time
stddev_over_time stdvar_over_time last_over_time present_over_time mad_over_time
acos acosh asin asinh atan atanh cos cosh sin sinh tan tanh deg rad pi
label_values label_names query_result metrics inf nan
""".split())


def metric_names(expr):
    """The metric names an expression (PromQL, or a Grafana variable query) refers to."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    text = re.sub(r"\{[^{}]*\}", "{}", text)  # label matchers
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1()", text)
    text = re.sub(r"\[[^\]]*\]", "[]", text)  # ranges
    text = re.sub(r"\$\{?\w+\}?", "", text)  # Grafana variables outside strings
    text = re.sub(r"label_values\(\s*([a-zA-Z_:][\w:]*)?\s*(\{\})?\s*,\s*\w+\s*\)", r"\1", text)
    found = set()
    for word in re.findall(r"(?<![\w.])[a-zA-Z_:][\w:]*", text):
        if word.lower() not in PROMQL_WORDS and not re.fullmatch(r"\d+[smhdwy]?", word):
            found.add(word)
    return found


def check_exprs(where, exprs, series):
    bad = {}
    for expr in exprs:
        for name in metric_names(expr) - series:
            bad.setdefault(name, expr)
    for name, expr in sorted(bad.items()):
        check(False, f"{where}: {name} is not a metric the gateway or workers export, in: {expr}")
    return not bad


def dashboard_exprs(dashboard):
    exprs, variables = [], []
    for p in dashboard.get("panels", []):
        for t in p.get("targets", []):
            exprs.append(t["expr"])
    for v in dashboard.get("templating", {}).get("list", []):
        if v.get("type") == "query":
            q = v.get("query")
            variables.append(q["query"] if isinstance(q, dict) else q)
    return exprs, variables


def grafana_to_promql(expr):
    """A dashboard query with Grafana's variables replaced, for promtool to parse."""
    expr = expr.replace("$__rate_interval", "5m").replace("$__interval", "1m")
    return re.sub(r"\$\{?(\w+)\}?", ".*", expr)


def metrics(promtool):
    names, series = exported_metrics()
    check(len(names) > 20, f"source: {len(names)} exported metric names found in {', '.join(SOURCE_DIRS)}")

    generated = subprocess.run([sys.executable, os.path.join(ROOT, "deploy/grafana/generate.py")],
                               capture_output=True, text=True, check=True).stdout
    committed = read("deploy/grafana/embatch.json")
    check(generated == committed,
          "deploy/grafana/embatch.json is what deploy/grafana/generate.py writes"
          + ("" if generated == committed else " (run: python3 deploy/grafana/generate.py --write)"))
    for original, copy in [("deploy/grafana/embatch.json", "deploy/helm/embatch/files/embatch-dashboard.json"),
                           ("deploy/prometheus/embatch-rules.yaml", "deploy/helm/embatch/files/embatch-rules.yaml")]:
        check(read(original) == read(copy), f"{copy} is identical to {original}")

    dashboard = json.loads(committed)
    exprs, variables = dashboard_exprs(dashboard)
    titles = [p["title"] for p in dashboard["panels"] if p["type"] != "row"]
    check(len(exprs) > 0 and all(exprs), f"dashboard: {len(titles)} panels, {len(exprs)} queries")
    if check_exprs("dashboard", exprs + variables, series):
        check(True, "dashboard: every query and variable names only exported metrics")
    var_names = {v["name"] for v in dashboard["templating"]["list"]}
    check({"datasource", "model", "tenant"} <= var_names, f"dashboard variables: {sorted(var_names)}")

    with tempfile.TemporaryDirectory() as tmp:
        rules = {"groups": [{"name": "dashboard", "rules": [
            {"record": f"dashboard:query:{i}", "expr": grafana_to_promql(e)} for i, e in enumerate(exprs)]}]}
        path = os.path.join(tmp, "dashboard-queries.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(rules, f)
        out = subprocess.run([promtool, "check", "rules", path], capture_output=True, text=True)
        check(out.returncode == 0, "dashboard: every query parses (promtool check rules)"
              + ("" if out.returncode == 0 else ": " + (out.stdout + out.stderr).strip()))

    rules = yaml.safe_load(read("deploy/prometheus/embatch-rules.yaml"))
    alerts = [r for g in rules["groups"] for r in g["rules"] if "alert" in r]
    if check_exprs("rules", [r["expr"] for g in rules["groups"] for r in g["rules"]], series):
        check(True, f"rules: the {len(alerts)} alerts' expressions name only exported metrics")
    tests = yaml.safe_load(read("deploy/prometheus/embatch-rules.test.yaml"))
    fires, quiet = set(), set()
    for t in tests["tests"]:
        for case in t.get("alert_rule_test", []):
            (fires if case.get("exp_alerts") else quiet).add(case["alertname"])
    for a in alerts:
        name = a["alert"]
        check(name in fires and name in quiet,
              f"rules: {name} has a test where it fires and one where it does not")

    used = set()
    for e in exprs + variables + [r["expr"] for g in rules["groups"] for r in g["rules"]]:
        used |= metric_names(e)
    unused = sorted(n for n in names if not ({n, n + "_bucket", n + "_sum", n + "_count"} & used))
    print("info metrics neither on the dashboard nor in an alert: " + (", ".join(unused) or "none"))


# ------------------------------------------------------------------------------------------
# env
# ------------------------------------------------------------------------------------------

NOT_FLAGS = {"RUST_LOG", "HF_HOME", "HF_HUB_OFFLINE"}


def readme_tables():
    """{section: {VAR: default or None}} from the configuration tables (docs/configuration.md)."""
    sections, current = {}, None
    for line in read("docs/configuration.md").splitlines():
        m = re.match(r"^## (NATS connection|Tracing|Worker|Gateway)\b", line)
        if m:
            current = m.group(1)
            sections[current] = {}
            continue
        if line.startswith("#"):
            current = None
        if current and line.startswith("| `"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            defaults = re.fullmatch(r"`([^`]*)`", cells[2])
            for var in re.findall(r"`([A-Z][A-Z0-9_]*)`", cells[0]):
                sections[current][var] = defaults.group(1) if defaults else None
    return sections


def env(manifests):
    tables = readme_tables()
    check(set(tables) == {"NATS connection", "Tracing", "Worker", "Gateway"} and all(tables.values()),
          "docs/configuration.md: tables found (" + ", ".join(f"{k}: {len(v)}" for k, v in tables.items()) + ")")
    both = set(tables.get("NATS connection", {})) | set(tables.get("Tracing", {})) | NOT_FLAGS
    allowed = {
        "gateway": set(tables.get("Gateway", {})) | both,
        "worker": set(tables.get("Worker", {})) | both,
    }
    for path in manifests:
        seen, bad = 0, []
        with open(path) as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        for doc in docs:
            spec = doc.get("spec", {}).get("template", {}).get("spec", {})
            for c in spec.get("containers", []):
                if c["name"] not in allowed:
                    continue
                for e in c.get("env", []):
                    seen += 1
                    if e["name"] not in allowed[c["name"]]:
                        bad.append(f'{doc["metadata"]["name"]}/{c["name"]}: {e["name"]}')
        check(not bad and seen > 0, f"{os.path.basename(path)}: {seen} env entries, each a setting of its binary"
              + ("" if not bad else " except " + ", ".join(bad)))

    values = yaml.safe_load(read("deploy/helm/embatch/values.yaml"))
    maps = [("config", values.get("config", {}), ["Gateway", "Worker"]),
            ("gateway.config", values["gateway"].get("config", {}), ["Gateway"]),
            ("workerDefaults.config", values["workerDefaults"].get("config", {}), ["Worker"])]
    for where, settings, binaries in maps:
        wrong = []
        for var, value in settings.items():
            if var in NOT_FLAGS:
                continue
            for b in binaries:
                table = {**tables.get(b, {}), **tables.get("NATS connection", {}), **tables.get("Tracing", {})}
                if var not in table:
                    wrong.append(f"{var} is not a {b.lower()} setting")
                elif table[var] is not None and str(value) != table[var]:
                    wrong.append(f"{var}={value!r}, the {b.lower()}'s default is {table[var]!r}")
        check(not wrong, f"values.yaml {where}: {len(settings)} settings, each the default in docs/configuration.md"
              + ("" if not wrong else ": " + "; ".join(wrong)))


# ------------------------------------------------------------------------------------------
# keda
# ------------------------------------------------------------------------------------------

def keda(promtool, manifest, template):
    with open(manifest) as f:
        docs = [d for d in yaml.safe_load_all(f) if d and d.get("kind") == "ScaledObject"]
    check(bool(docs), f"{os.path.basename(manifest)}: {len(docs)} ScaledObjects")
    if not docs:
        return
    so = docs[0]
    queries = {t["name"]: t["metadata"]["query"] for t in so["spec"]["triggers"] if t["type"] == "prometheus"}
    print(f"info testing the Prometheus triggers of ScaledObject {so['metadata']['name']}: {', '.join(sorted(queries))}")
    text = read(template)
    missing = sorted(set(re.findall(r"\$\{([\w-]+)\}", text)) - set(queries))
    check(not missing, "every query the test names is rendered" + ("" if not missing else f" (missing: {missing})"))
    for name, query in queries.items():
        text = text.replace("${" + name + "}", query)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "keda-queries.test.yaml")
        with open(path, "w") as f:
            f.write(text)
        out = subprocess.run([promtool, "test", "rules", path], capture_output=True, text=True, cwd=tmp)
        check(out.returncode == 0, f"the KEDA queries give the replicas expected ({template})"
              + ("" if out.returncode == 0 else ":\n" + (out.stdout + out.stderr).strip()))


def fails(pattern):
    stderr = sys.stdin.read()
    found = re.search(pattern, stderr)
    check(bool(found), "refused: " + (found.group(0) if found else f"expected an error matching {pattern!r}, got: {stderr.strip()!r}"))


COMMANDS = {
    # promtool's path made absolute: the checks run it from other directories.
    "metrics": lambda promtool: metrics(os.path.abspath(promtool)),
    "env": lambda *manifests: env(list(manifests)),
    "keda": lambda promtool, *files: keda(os.path.abspath(promtool), *files),
    "fails": fails,
}


if __name__ == "__main__":
    sys.exit(outcome.run(COMMANDS, sys.argv))
