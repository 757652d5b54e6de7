"""Refresh the KubeRay CRD schemas kept here (README.md beside this file says where they come from).

    python cluster/kuberay/schemas/refresh.py v1.7.0                 # download that release's CRDs
    python cluster/kuberay/schemas/refresh.py v1.7.0 --crd-dir DIR   # or read them from a checkout

Writes `<plural>.v1.json` for RayCluster and RayJob: the `openAPIV3Schema` of the CRD's served
`v1` version, nothing else, as the API server checks it. Update README.md's release line with the
same ref and run tests/cluster/test_kuberay_manifests.py.
"""

from __future__ import annotations

import argparse
import json
import urllib.request
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
REPOSITORY = "ray-project/kuberay"
CRD_DIR = "ray-operator/config/crd/bases"
CRDS = ("rayclusters", "rayjobs")
VERSION = "v1"


def served_schema(crd: dict, version: str = VERSION) -> dict:
    """The openAPIV3Schema of `version` in a CustomResourceDefinition; fails if it is not served."""
    for entry in crd["spec"]["versions"]:
        if entry["name"] == version:
            if not entry.get("served"):
                raise SystemExit(f"{crd['metadata']['name']}: {version} is not served")
            return entry["schema"]["openAPIV3Schema"]
    raise SystemExit(f"{crd['metadata']['name']}: no version {version}")


def crd_text(ref: str, plural: str, crd_dir: Path | None) -> str:
    name = f"ray.io_{plural}.yaml"
    if crd_dir is not None:
        return (crd_dir / name).read_text()
    url = f"https://raw.githubusercontent.com/{REPOSITORY}/{ref}/{CRD_DIR}/{name}"
    with urllib.request.urlopen(url, timeout=60) as reply:
        return reply.read().decode()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ref", help="KubeRay tag or commit, e.g. v1.7.0")
    parser.add_argument("--crd-dir", type=Path, help=f"a checkout's {CRD_DIR} (no download)")
    args = parser.parse_args(argv)
    for plural in CRDS:
        schema = served_schema(yaml.safe_load(crd_text(args.ref, plural, args.crd_dir)))
        path = HERE / f"{plural}.{VERSION}.json"
        path.write_text(json.dumps(schema, indent=1) + "\n")
        print(f"{path.name}: {len(schema['properties']['spec']['properties'])} spec fields")


if __name__ == "__main__":
    main()
