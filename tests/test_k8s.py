#!/usr/bin/python3
"""test_k8s.py - docker/k8s's manifests checked offline (no cluster): every
kustomization resource parses, and what must agree does: the Deployment's
selector and its pods' labels, the Service's and the PodDisruptionBudget's
selectors, the container port against CONVGRAD_LISTEN, the Service's
targetPorts and both gRPC probes; the metrics port against
CONVGRAD_METRICS_LISTEN and the pods' prometheus.io scrape annotations; requests equal to limits in whole cores
(Guaranteed QoS, the static CPU manager's exclusive cpuset);
terminationGracePeriodSeconds above CONVGRAD_GRACE; a headless Service; a
budget that leaves a replica up; the pod's user the image's. Then each of a
few broken copies must be refused, so that the checks can fail.

Usage: test_k8s.py --dir docker/k8s --dockerfile docker/Dockerfile"""
import argparse
import copy
import os
import re
import sys

import yaml


class Inconsistent(Exception):
    pass


def fail(msg):
    raise Inconsistent(msg)


def load(directory):
    kust = yaml.safe_load(open(os.path.join(directory, "kustomization.yaml")))
    docs = []
    for res in kust["resources"]:
        for d in yaml.safe_load_all(open(os.path.join(directory, res))):
            if d:
                docs.append(d)
    by_kind = {}
    for d in docs:
        for key in ("apiVersion", "kind", "metadata"):
            if key not in d:
                fail("a document of %s lacks %s" % (d.get("kind"), key))
        by_kind.setdefault(d["kind"], []).append(d)
    for kind in ("Deployment", "Service", "PodDisruptionBudget"):
        if len(by_kind.get(kind, [])) != 1:
            fail("expected one %s, got %d" % (kind, len(by_kind.get(kind,
                                                                     []))))
    return (by_kind["Deployment"][0], by_kind["Service"][0],
            by_kind["PodDisruptionBudget"][0])


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v
                                  for k, v in selector.items())


def cpu_cores(v):
    """A CPU quantity as cores; None unless it is a whole number."""
    s = str(v)
    if s.endswith("m"):
        m = int(s[:-1])
        return m // 1000 if m % 1000 == 0 else None
    return int(s) if re.fullmatch(r"\d+", s) else None


def check_deployment(dep, uid):
    spec = dep["spec"]
    pod = spec["template"]
    labels = pod["metadata"]["labels"]
    if not selects(spec["selector"]["matchLabels"], labels):
        fail("the Deployment's selector does not match its pods' labels")
    if spec.get("replicas", 1) < 2:
        fail("fewer than 2 replicas: a drain would stop the service")
    (c,) = pod["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    if "grpc" not in ports:
        fail("no container port named grpc")
    listen = env.get("CONVGRAD_LISTEN", "")
    if not listen.startswith("0.0.0.0:") or \
            int(listen.split(",")[0].rsplit(":", 1)[1]) != ports["grpc"]:
        fail("CONVGRAD_LISTEN %r does not serve container port %d on every "
             "interface" % (listen, ports["grpc"]))
    res = c["resources"]
    if res.get("requests") != res.get("limits"):
        fail("requests %s differ from limits %s: not Guaranteed QoS"
             % (res.get("requests"), res.get("limits")))
    if cpu_cores(res["limits"].get("cpu")) in (None, 0):
        fail("cpu %r is not a whole number of cores" % res["limits"].get("cpu"))
    if "memory" not in res["limits"]:
        fail("no memory limit")
    for probe in ("readinessProbe", "livenessProbe"):
        p = c.get(probe)
        if not p or "grpc" not in p:
            fail("%s is not a gRPC health probe" % probe)
        if p["grpc"]["port"] != ports["grpc"]:
            fail("%s checks port %s, the server listens on %d"
                 % (probe, p["grpc"]["port"], ports["grpc"]))
        if p.get("timeoutSeconds", 1) >= p.get("periodSeconds", 10):
            fail("%s times out after its next period" % probe)
    metrics = env.get("CONVGRAD_METRICS_LISTEN", "")
    if "metrics" not in ports or metrics != "0.0.0.0:%d" % ports["metrics"]:
        fail("CONVGRAD_METRICS_LISTEN %r does not serve the metrics port %s "
             "on every interface" % (metrics, ports.get("metrics")))
    notes = pod["metadata"].get("annotations", {})
    if notes.get("prometheus.io/scrape") != "true" or \
            notes.get("prometheus.io/port") != str(ports["metrics"]) or \
            notes.get("prometheus.io/path", "/metrics") != "/metrics":
        fail("the scrape annotations %s do not name the metrics port %d "
             "and /metrics" % (notes, ports["metrics"]))
    grace = int(env.get("CONVGRAD_GRACE", "30"))
    if pod["spec"].get("terminationGracePeriodSeconds", 30) <= grace:
        fail("terminationGracePeriodSeconds must exceed CONVGRAD_GRACE %d"
             % grace)
    sc = pod["spec"].get("securityContext", {})
    if not sc.get("runAsNonRoot") or sc.get("runAsUser") != uid:
        fail("the pod must run as the image's non-root user %d" % uid)
    return labels, ports, spec.get("replicas", 1)


def check(dep, svc, pdb, uid):
    labels, ports, replicas = check_deployment(dep, uid)
    if svc["spec"].get("clusterIP") != "None":
        fail("the Service is not headless: round_robin would see one "
             "address")
    if not selects(svc["spec"]["selector"], labels):
        fail("the Service's selector does not match the pods")
    served = {}
    for p in svc["spec"]["ports"]:
        target = p.get("targetPort", p["port"])
        target = ports.get(target, target)
        if target not in ports.values():
            fail("the Service's port %s targets %s, which no container port "
                 "is" % (p["port"], p.get("targetPort")))
        served[p.get("name")] = target
    if served.get("grpc") != ports["grpc"]:
        fail("the Service's grpc port does not reach the gRPC port")
    if not selects(pdb["spec"]["selector"]["matchLabels"], labels):
        fail("the PodDisruptionBudget's selector does not match the pods")
    if "maxUnavailable" in pdb["spec"]:
        if not 0 < pdb["spec"]["maxUnavailable"] < replicas:
            fail("maxUnavailable must leave a replica up")
    elif not 0 < pdb["spec"].get("minAvailable", 0) < replicas:
        fail("minAvailable must be at least 1 and below the replicas")


def check_tls_overlay(directory, dep):
    """docker/k8s/tls: a kustomization over the base whose patch names
    the base Deployment and container, mounts the Secret it names where the
    server's TLS files are read, and probes health over TLS on the gRPC
    port with the mounted CA."""
    kust = yaml.safe_load(open(os.path.join(directory, "kustomization.yaml")))
    if kust.get("resources") != [".."]:
        fail("the TLS overlay must build on the base (resources: [..])")
    (patch_ref,) = kust["patches"]
    patch = yaml.safe_load(open(os.path.join(directory, patch_ref["path"])))
    if patch["metadata"]["name"] != dep["metadata"]["name"]:
        fail("the TLS patch names Deployment %r, the base is %r"
             % (patch["metadata"]["name"], dep["metadata"]["name"]))
    spec = patch["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    if c["name"] != container(dep)["name"]:
        fail("the TLS patch's container %r is not the base's" % c["name"])
    volumes = {v["name"]: v for v in spec["volumes"]}
    (mount,) = c["volumeMounts"]
    if "secret" not in volumes.get(mount["name"], {}):
        fail("the TLS mount %r is not a Secret volume" % mount["name"])
    root = mount["mountPath"].rstrip("/") + "/"
    env = {e["name"]: e["value"] for e in c["env"]}
    for var in ("CONVGRAD_TLS_CERT", "CONVGRAD_TLS_KEY"):
        if not env.get(var, "").startswith(root):
            fail("%s %r is not in the Secret's mount %s"
                 % (var, env.get(var), root))
    port = {p["name"]: p["containerPort"]
            for p in container(dep)["ports"]}["grpc"]
    for probe in ("readinessProbe", "livenessProbe"):
        p = c[probe]
        cmd = p.get("exec", {}).get("command", [])
        if cmd[:2] != ["convgrad", "health"] or p.get("$patch") != "replace":
            fail("%s must replace the gRPC probe with convgrad health"
                 % probe)
        opts = dict(zip(cmd[2::2], cmd[3::2]))
        if opts.get("--target") != "127.0.0.1:%d" % port:
            fail("%s checks %s, the server listens on %d"
                 % (probe, opts.get("--target"), port))
        if not opts.get("--tls-ca", "").startswith(root):
            fail("%s's --tls-ca is not in the Secret's mount" % probe)
        if int(opts.get("--deadline", "0")) >= 1000 * p["timeoutSeconds"]:
            fail("%s's deadline outlasts its timeout" % probe)


def container(dep):
    return dep["spec"]["template"]["spec"]["containers"][0]


# Broken copies, each of which check() must refuse.
BREAKS = [
    ("not headless", lambda d, s, p: s["spec"].update(clusterIP="10.0.0.1")),
    ("selector", lambda d, s, p: s["spec"]["selector"].update(
        {"app.kubernetes.io/name": "other"})),
    ("grace", lambda d, s, p: d["spec"]["template"]["spec"].update(
        terminationGracePeriodSeconds=30)),
    ("quota", lambda d, s, p: container(d)["resources"]["requests"].update(
        cpu="1500m")),
    ("probe port", lambda d, s, p: container(d)["readinessProbe"]["grpc"]
     .update(port=50052)),
    ("pdb", lambda d, s, p: p["spec"].update(maxUnavailable=2)),
    ("scrape port", lambda d, s, p: d["spec"]["template"]["metadata"]
     ["annotations"].update({"prometheus.io/port": "9090"})),
    ("metrics listen", lambda d, s, p: container(d)["env"].append(
        {"name": "CONVGRAD_METRICS_LISTEN", "value": "127.0.0.1:9464"})),
    ("service target", lambda d, s, p: s["spec"]["ports"][1].update(
        targetPort=9999)),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--dockerfile", required=True)
    args = ap.parse_args()
    m = re.search(r"useradd --uid (\d+)", open(args.dockerfile).read())
    if not m:
        raise SystemExit("no useradd --uid UID in %s" % args.dockerfile)
    uid = int(m.group(1))
    try:
        dep, svc, pdb = load(args.dir)
        check(dep, svc, pdb, uid)
        check_tls_overlay(os.path.join(args.dir, "tls"), dep)
    except Inconsistent as e:
        raise SystemExit("test_k8s: %s" % e)
    for name, brk in BREAKS:
        d, s, p = copy.deepcopy(dep), copy.deepcopy(svc), copy.deepcopy(pdb)
        brk(d, s, p)
        try:
            check(d, s, p, uid)
        except Inconsistent:
            continue
        raise SystemExit("test_k8s: the broken copy '%s' passed" % name)
    print("k8s manifests: Deployment (%s replicas, %s cores), headless "
          "Service, PodDisruptionBudget, TLS overlay consistent; %d broken "
          "copies refused"
          % (dep["spec"]["replicas"],
             container(dep)["resources"]["limits"]["cpu"], len(BREAKS)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
