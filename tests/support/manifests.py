"""The kustomize trees under ops/k8s built in Python, so the manifest tests need no kustomize binary.

`build(folder)` does what `kustomize build` does with the features ops/k8s uses: resources
(files and folders), components, patches (strategic-merge by kind and name or by target, JSON 6902
op lists, `$patch: delete`), namespace, labels and images. It raises on anything else, so a
manifest change that needs more fails loudly here rather than being half-understood.
tests/test_ops_manifests.py compares it with `kubectl kustomize` where kubectl is installed.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "ops" / "k8s"
BASE = K8S / "base"
OVERLAYS = sorted(p.parent for p in (K8S / "overlays").glob("*/kustomization.yaml"))
CLUSTER_SCOPED = frozenset(
    {"Namespace", "PersistentVolume", "StorageClass", "ClusterRole", "ClusterRoleBinding"}
)
KNOWN_FIELDS = frozenset(
    {"apiVersion", "kind", "resources", "components", "patches", "namespace", "labels", "images"}
)
Obj = dict[str, Any]


def load_yaml(path: Path) -> list[Any]:
    with path.open(encoding="utf-8") as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


def kustomization(folder: Path) -> Obj:
    (k,) = load_yaml(folder / "kustomization.yaml")
    unknown = set(k) - KNOWN_FIELDS
    if unknown:
        raise ValueError(f"{folder}: tests/support/manifests.py does not build {sorted(unknown)}")
    return dict(k)


def build(folder: Path) -> list[Obj]:
    """The objects `kustomize build folder` prints (in file order, not kustomize's kind order)."""
    k = kustomization(folder)
    objects: list[Obj] = []
    for entry in k.get("resources", []):
        path = folder / entry
        objects += build(path) if path.is_dir() else [copy.deepcopy(d) for d in load_yaml(path)]
    for entry in k.get("components", []):
        component = folder / entry
        if kustomization(component).get("kind") != "Component":
            raise ValueError(f"{component} is not a kustomize Component")
        objects = _transform(component, kustomization(component), objects + _own_resources(component))
    return _transform(folder, k, objects)


def _own_resources(folder: Path) -> list[Obj]:
    return [d for entry in kustomization(folder).get("resources", []) for d in load_yaml(folder / entry)]


def _transform(folder: Path, k: Obj, objects: list[Obj]) -> list[Obj]:
    for patch in k.get("patches", []):
        objects = apply_patch(folder, patch, objects)
    if "namespace" in k:
        for obj in objects:
            if obj["kind"] not in CLUSTER_SCOPED:
                obj["metadata"]["namespace"] = k["namespace"]
    for entry in k.get("labels", []):
        if entry.get("includeSelectors") or entry.get("includeTemplates"):
            raise ValueError("labels with includeSelectors/includeTemplates are not built here")
        for obj in objects:
            obj["metadata"].setdefault("labels", {}).update(entry["pairs"])
    for image in k.get("images", []):
        for container in containers(objects):
            name, _, _tag = container["image"].partition(":")
            if name == image["name"]:
                container["image"] = f"{image.get('newName', name)}:{image['newTag']}"
    return objects


def patch_targets(folder: Path, patch: Obj, objects: list[Obj]) -> list[tuple[Any, list[Obj]]]:
    """(a patch body, the objects it applies to) for each body of the patch (a file may hold several)."""
    bodies = (
        load_yaml(folder / patch["path"]) if "path" in patch else list(yaml.safe_load_all(patch["patch"]))
    )
    if isinstance(bodies[0], list):  # a JSON 6902 op list
        if "target" not in patch:
            raise ValueError(f"{folder}: a JSON 6902 patch needs a target")
        return [(bodies[0], [o for o in objects if _selected(o, patch["target"])])]
    if "target" in patch:
        return [(doc, [o for o in objects if _selected(o, patch["target"])]) for doc in bodies]
    return [
        (doc, [o for o in objects if ident(o) == ident(doc) and _same_namespace(o, doc)]) for doc in bodies
    ]


def apply_patch(folder: Path, patch: Obj, objects: list[Obj]) -> list[Obj]:
    for body, targets in patch_targets(folder, patch, objects):
        if not targets:
            raise ValueError(f"{folder}: patch {patch} matches no object")
        if isinstance(body, list):
            for obj in targets:
                for op in body:
                    json_patch(obj, op)
        elif body.get("$patch") == "delete":
            objects = [o for o in objects if not any(o is t for t in targets)]
        else:
            objects = [_merged(o, body) if any(o is t for t in targets) else o for o in objects]
    return objects


def _merged(obj: Obj, body: Obj) -> Obj:
    group = obj["apiVersion"].rpartition("/")[0]
    new: Obj = merge(obj, body, crd="." in group and not group.endswith(".k8s.io"))
    # A targeted patch's own kind and name are placeholders, never a rename.
    new["kind"], new["apiVersion"] = obj["kind"], obj["apiVersion"]
    new["metadata"]["name"] = obj["metadata"]["name"]
    return new


def merge(base: Any, patch: Any, crd: bool) -> Any:
    """A strategic-merge patch as kustomize applies it: maps merge, `null` deletes, lists of named
    items (containers, env, volumes, ports) merge by name on built-in kinds; CRDs get JSON merge
    patch semantics (lists replaced whole)."""
    if isinstance(patch, dict) and isinstance(base, dict):
        out = dict(base)
        for key, value in patch.items():
            if value is None:
                out.pop(key, None)
            else:
                out[key] = merge(base[key], value, crd) if key in base else copy.deepcopy(value)
        return out
    if (
        not crd
        and isinstance(patch, list)
        and isinstance(base, list)
        and all(isinstance(i, dict) and "name" in i for i in [*base, *patch])
    ):
        by_name = {item["name"]: item for item in patch}
        merged = [
            merge(item, by_name.pop(item["name"]), crd) if item["name"] in by_name else item for item in base
        ]
        return merged + list(by_name.values())
    return copy.deepcopy(patch)


def json_patch(obj: Obj, op: Obj) -> None:
    """One RFC 6902 operation (add, replace, remove) on obj, in place."""
    *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].lstrip("/").split("/")]
    node: Any = obj
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    key: Any = int(last) if isinstance(node, list) and last != "-" else last
    if op["op"] in ("remove", "replace") and not (key in node if isinstance(node, dict) else key < len(node)):
        raise KeyError(f"JSON patch path {op['path']} does not exist")  # kustomize refuses it too
    if op["op"] == "remove":
        del node[key]
    elif op["op"] in ("replace", "add"):
        if isinstance(node, list) and op["op"] == "add":
            node.insert(len(node) if key == "-" else key, copy.deepcopy(op["value"]))
        else:
            node[key] = copy.deepcopy(op["value"])
    else:
        raise ValueError(f"JSON patch op {op['op']!r} is not built here")


def _selected(obj: Obj, target: Obj) -> bool:
    group, _, version = obj["apiVersion"].rpartition("/")
    checks = {
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "group": group,
        "version": version,
        "namespace": obj["metadata"].get("namespace", ""),
    }
    for field, actual in checks.items():
        if field in target and not re.fullmatch(target[field], actual):
            return False
    return "labelSelector" not in target or _labels_match(
        obj["metadata"].get("labels", {}), target["labelSelector"]
    )


def _labels_match(labels: dict[str, str], selector: str) -> bool:
    for term in re.split(r",(?![^(]*\))", selector):
        if m := re.fullmatch(r"\s*([\w./-]+)\s+in\s+\(([^)]*)\)\s*", term):
            if labels.get(m[1]) not in {v.strip() for v in m[2].split(",")}:
                return False
        elif m := re.fullmatch(r"\s*([\w./-]+)\s*==?\s*([\w.-]+)\s*", term):
            if labels.get(m[1]) != m[2]:
                return False
        else:
            raise ValueError(f"label selector term {term!r} is not built here")
    return True


def _same_namespace(obj: Obj, doc: Obj) -> bool:
    wanted = doc["metadata"].get("namespace")
    return wanted is None or obj["metadata"].get("namespace") == wanted


def ident(obj: Obj) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


def pod_specs(objects: list[Obj]) -> Iterator[tuple[Obj, Obj]]:
    """(workload, its pod spec) for every Deployment and Job."""
    for obj in objects:
        if obj["kind"] in ("Deployment", "Job"):
            yield obj, obj["spec"]["template"]["spec"]


def containers(objects: list[Obj]) -> Iterator[Obj]:
    for _, spec in pod_specs(objects):
        yield from spec.get("initContainers", [])
        yield from spec["containers"]


def find(objects: list[Obj], kind: str, name: str) -> Obj:
    (obj,) = [o for o in objects if ident(o) == (kind, name)]
    return obj
