"""``warmpath manifests --topology NAME|FILE --out DIR``: write a topology's Kubernetes
manifests (``manifests.py``) as YAML files plus a ``kustomization.yaml`` listing them, for
``kubectl apply -k DIR`` (or ``-f DIR``)."""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from warmpath.launch.manifests import DEFAULT_IMAGE, ManifestConfig, render

# flag → (ManifestConfig field, default), in the order the header lists them
FLAGS = {"--image": ("image", DEFAULT_IMAGE), "--namespace": ("namespace", "warmpath"),
         "--gpus-per-worker": ("gpus_per_worker", 0), "--cpus-per-worker": ("cpus_per_worker", 2),
         "--worker-memory-gib": ("worker_memory_gib", 0.0), "--store-gib": ("store_gib", 2.0),
         "--model": ("model", "smollm2"), "--secret": ("secret", "warmpath-secrets"),
         "--drain-timeout-s": ("drain_timeout_s", 120), "--routers": ("routers", 1)}


def add_parser(sub) -> None:
    p = sub.add_parser("manifests", help="write Kubernetes manifests of a topology (kubectl apply -k DIR)")
    p.add_argument("--topology", required=True, help="a named topology (e.g. cpd-1d) or a topology .json file")
    p.add_argument("--out", required=True, metavar="DIR", help="folder to write the YAML files to")
    p.add_argument("--image", default=DEFAULT_IMAGE, help="container image with warmpath and the model installed")
    p.add_argument("--namespace", default="warmpath")
    p.add_argument("--gpus-per-worker", type=int, default=0,
                   help="nvidia.com/gpu per worker pod (0: CPU workers)")
    p.add_argument("--cpus-per-worker", type=int, default=2, help="CPU request of a worker pod (= its --threads)")
    p.add_argument("--worker-memory-gib", type=float, default=0.0,
                   help="memory request and limit of a worker pod (0: 4 for CPU workers, 16 with GPUs)")
    p.add_argument("--store-gib", type=float, default=2.0, help="memory the store pod lends to Mooncake")
    p.add_argument("--model", default="smollm2", help="the model every worker serves (in the image)")
    p.add_argument("--secret", default="warmpath-secrets",
                   help="Secret with the keys cluster-token (every pod) and api-keys (the router)")
    p.add_argument("--drain-timeout-s", type=int, default=120,
                   help="how long a terminating worker may answer its requests under way")
    p.add_argument("--routers", type=int, default=1,
                   help="routers, active-active: a StatefulSet of N behind the clients' Service, each a peer of "
                        "the others, every worker reporting to all of them (1: one router Deployment)")
    p.set_defaults(fn=run)


def config(a: argparse.Namespace) -> ManifestConfig:
    """The parsed flags as a config (``ValueError`` naming a bad one)."""
    from warmpath.launch.topology import resolve

    return ManifestConfig(resolve(a.topology), **{f: getattr(a, f) for f, _ in FLAGS.values()})


def header(cfg: ManifestConfig) -> str:
    """The comment each file opens with: the command that renders it again."""
    flags = "".join(f" {flag} {getattr(cfg, f)}" for flag, (f, d) in FLAGS.items() if getattr(cfg, f) != d)
    return (f"# Rendered by `warmpath manifests --topology {cfg.topology.name}{flags}`: change the topology or\n"
            "# the flags and render again rather than editing (deploy/k8s/ is checked against a fresh render).\n")


class _Plain(yaml.SafeDumper):
    """YAML without anchors and aliases (objects share label dicts; readers should not care)."""

    def ignore_aliases(self, data) -> bool:
        return True


def texts(cfg: ManifestConfig) -> dict[str, str]:
    """File name → its YAML text (every manifest file, then ``kustomization.yaml``)."""
    files = render(cfg)
    kust = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "resources": list(files)}
    return {name: header(cfg) + yaml.dump_all(objs, Dumper=_Plain, sort_keys=False, width=120, explicit_start=True)
            for name, objs in {**files, "kustomization.yaml": [kust]}.items()}


def run(a: argparse.Namespace) -> int:
    cfg = config(a)
    out = Path(a.out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {a.out}: not a folder")
    out.mkdir(parents=True, exist_ok=True)
    for name, text in texts(cfg).items():
        (out / name).write_text(text)
    roles = ", ".join(f"{n} {r}" for r, n in cfg.topology.workers.items() if n)
    print(f"warmpath: wrote {cfg.topology.name} ({roles}) to {out}/; apply with: kubectl apply -k {out}\n"
          f"  first: kubectl create namespace {cfg.namespace}; kubectl -n {cfg.namespace} create secret generic "
          f"{cfg.secret} --from-literal=cluster-token=$(openssl rand -hex 32) --from-literal=api-keys=KEY1,KEY2")
    return 0
