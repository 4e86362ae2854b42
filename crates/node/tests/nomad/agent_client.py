"""python-nomad against a real wharf agent: each call's result is checked for the values the
job produced. Prints one line `ok <call>` per call checked; any failed check raises.

Environment: NOMAD_ADDR (http://host:port), NOMAD_TOKEN."""

import base64
import json
import os
import threading
import time

import nomad
import nomad.api.exceptions as nomad_errors
import requests

ADDR = os.environ["NOMAD_ADDR"]
TOKEN = os.environ["NOMAD_TOKEN"]
LIMIT = 20.0
n = nomad.Nomad(address=ADDR, token=TOKEN, timeout=LIMIT)

SCRIPT = (
    'env | grep ^NOMAD_ | sort > "$NOMAD_ALLOC_DIR/env.txt"; '
    'echo "hello-from-$NOMAD_TASK_NAME"; '
    'trap "echo got-usr1" USR1; '
    "while true; do sleep 0.1; done"
)


def job(job_id, **task_extra):
    task = {
        "Name": "web",
        "Driver": "raw_exec",
        "Config": {"command": "/bin/sh", "args": ["-c", SCRIPT]},
        "Resources": {"CPU": 100, "MemoryMB": 64},
        "KillTimeout": 2_000_000_000,
        "KillSignal": "SIGTERM",
    }
    task.update(task_extra)
    return {
        "Job": {
            "ID": job_id,
            "Name": job_id,
            "Type": "service",
            "Region": "global",
            "Datacenters": ["dc1"],
            "Meta": {"owner": "tests"},
            "TaskGroups": [
                {
                    "Name": "g",
                    "Count": 2,
                    "RestartPolicy": {"Attempts": 3, "Interval": 60_000_000_000, "Delay": 100_000_000, "Mode": "fail"},
                    "Networks": [{"DynamicPorts": [{"Label": "http", "Value": 0, "To": 0}]}],
                    "Tasks": [task],
                }
            ],
        }
    }


def eventually(what, check):
    deadline = time.monotonic() + LIMIT
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except nomad_errors.BaseNomadException as e:
            last = e
        time.sleep(0.1)
    raise AssertionError(f"never {what}; last: {last!r}")


def ok(call):
    print("ok", call, flush=True)


def frames(text):
    """The data of a stream of JSON frames, and how many heartbeats it held."""
    decoder, at, data, beats = json.JSONDecoder(), 0, b"", 0
    while at < len(text):
        while at < len(text) and text[at].isspace():
            at += 1
        if at >= len(text):
            break
        frame, at = decoder.raw_decode(text, at)
        if frame == {}:
            beats += 1
            continue
        assert set(frame) >= {"Offset", "Data", "File", "FileEvent"}, frame
        data += base64.b64decode(frame["Data"])
    return data.decode(), beats


# A wrong token: 403 with Nomad's words.
try:
    nomad.Nomad(address=ADDR, token="wrong-token", timeout=LIMIT).jobs.get_jobs()
    raise AssertionError("a wrong token was accepted")
except nomad_errors.URLNotAuthorizedNomadException as e:
    assert e.nomad_resp.status_code == 403 and e.nomad_resp.text == "Permission denied", e.nomad_resp.text
ok("token refused")

# A field wharf lacks: refused with its name.
try:
    n.job.register_job("vaulted", job("vaulted", Vault={"Policies": ["db"]}))
    raise AssertionError("a job with Vault was accepted")
except nomad_errors.BadRequestNomadException as e:
    assert "Job.TaskGroups[0].Tasks[0].Vault" in e.nomad_resp.text, e.nomad_resp.text
ok("vault refused")

# event.stream.get_stream, started before the job exists: its events arrive as it runs.
stream, stream_exit, events = n.event.stream.get_stream(index=0, topic=["Job:pyweb", "Allocation"], timeout=LIMIT * 3)
stream.daemon = True
stream.start()

# job.register_job
answer = n.job.register_job("pyweb", job("pyweb"))
assert answer["EvalID"] and answer["JobModifyIndex"] > 0, answer
evaluation = n.evaluation.get_evaluation(answer["EvalID"])
assert evaluation["Status"] == "complete" and evaluation["JobID"] == "pyweb", evaluation
assert evaluation["TriggeredBy"] == "job-register", evaluation
ok("job.register_job")

# jobs.get_jobs
jobs = n.jobs.get_jobs()
mine = [j for j in jobs if j["ID"] == "pyweb"]
assert len(mine) == 1, jobs
assert mine[0]["Type"] == "service" and mine[0]["Datacenters"] == ["dc1"] and mine[0]["Meta"] == {"owner": "tests"}, mine
ok("jobs.get_jobs")
shown = n.job.get_job("pyweb")
assert shown["Region"] == "global" and shown["Priority"] == 50 and shown["Namespace"] == "default", shown
assert shown["TaskGroups"][0]["Tasks"][0]["Config"]["command"] == "/bin/sh", shown
ok("job.get_job")

# job.get_allocations: one allocation per group instance, both running.
allocs = eventually(
    "both allocations running",
    lambda: (lambda a: a if len(a) == 2 and all(x["ClientStatus"] == "running" for x in a) else None)(
        n.job.get_allocations("pyweb")
    ),
)
assert sorted(a["Name"] for a in allocs) == ["pyweb.g[0]", "pyweb.g[1]"], allocs
assert all(a["JobID"] == "pyweb" and a["TaskGroup"] == "g" and a["DesiredStatus"] == "run" for a in allocs), allocs
ok("job.get_allocations")
alloc_id = sorted(allocs, key=lambda a: a["Name"])[0]["ID"]

# Registering the same job again places nothing new.
again = n.job.register_job("pyweb", job("pyweb"))
assert again["EvalID"] != answer["EvalID"], again
assert sorted(a["ID"] for a in n.job.get_allocations("pyweb")) == sorted(a["ID"] for a in allocs)
ok("job.register_job unchanged")

# validate.validate_job: the node's verdict, with the field named.
verdict = n.validate.validate_job(job("checked")).json()
assert verdict["DriverConfigValidated"] is True and verdict["ValidationErrors"] == [], verdict
verdict = n.validate.validate_job(job("checked", Vault={"Policies": ["app"]})).json()
assert verdict["DriverConfigValidated"] is False and "Job.TaskGroups[0].Tasks[0].Vault" in verdict["Error"], verdict
ok("validate.validate_job")

# allocations.get_allocations (prefix too)
listed = n.allocations.get_allocations()
assert {a["ID"] for a in allocs} <= {a["ID"] for a in listed}, listed
prefixed = n.allocations.get_allocations(prefix=alloc_id[:8])
assert [a["ID"] for a in prefixed] == [alloc_id], prefixed
ok("allocations.get_allocations")

# allocation.get_allocation: task states with Nomad's events.
alloc = n.allocation.get_allocation(alloc_id)
state = alloc["TaskStates"]["web"]
assert state["State"] == "running" and state["Failed"] is False and state["Restarts"] == 0, state
types = [e["Type"] for e in state["Events"]]
assert types[0] == "Received" and "Task Setup" in types and "Started" in types, types
assert alloc["Job"]["ID"] == "pyweb" and alloc["NodeID"], alloc
ok("allocation.get_allocation")

# node.get_node: the node's address, resources and drivers.
node = n.node.get_node(alloc["NodeID"])
assert "http://" + node["HTTPAddr"] == ADDR, (node["HTTPAddr"], ADDR)
assert node["Drivers"]["raw_exec"]["Healthy"] is True and node["Drivers"]["raw_exec"]["Detected"] is True, node["Drivers"]
assert node["NodeResources"]["Memory"]["MemoryMB"] > 0 and node["NodeResources"]["Cpu"]["CpuShares"] > 0, node["NodeResources"]
assert node["Status"] == "ready", node
ok("node.get_node")

# agent.get_agent
agent = n.agent.get_agent()
assert agent["config"]["Client"]["Enabled"] is True and agent["config"]["Server"]["Enabled"] is False, agent
assert agent["member"]["Tags"]["id"] == alloc["NodeID"], agent
ok("agent.get_agent")

# client.cat.read_file: the task's environment, Nomad's variables.
env = dict(
    line.split("=", 1)
    for line in eventually("env.txt written", lambda: n.client.cat.read_file(alloc_id, "alloc/env.txt")).splitlines()
)
assert env["NOMAD_ALLOC_ID"] == alloc_id, env
assert env["NOMAD_TASK_NAME"] == "web" and env["NOMAD_GROUP_NAME"] == "g", env
assert env["NOMAD_JOB_ID"] == "pyweb" and env["NOMAD_JOB_NAME"] == "pyweb", env
assert env["NOMAD_CPU_LIMIT"] == "100" and env["NOMAD_MEMORY_LIMIT"] == "64", env
assert env["NOMAD_ALLOC_DIR"].endswith("/" + alloc_id + "/alloc"), env
assert env["NOMAD_TASK_DIR"].endswith("/" + alloc_id + "/web/local"), env
assert env["NOMAD_SECRETS_DIR"].endswith("/" + alloc_id + "/web/secrets"), env
assert int(env["NOMAD_PORT_http"]) > 0 and env["NOMAD_ADDR_http"] == env["NOMAD_IP_http"] + ":" + env["NOMAD_PORT_http"], env
assert env["NOMAD_ALLOC_INDEX"] == "0" and env["NOMAD_ALLOC_NAME"] == "pyweb.g[0]", env
assert env["NOMAD_META_owner"] == "tests", env
ok("client.cat.read_file")

# client.ls.list_files: Nomad's layout.
root = {f["Name"]: f for f in n.client.ls.list_files(alloc_id, "/")}
assert root["alloc"]["IsDir"] and root["web"]["IsDir"], root
logs = {f["Name"]: f for f in n.client.ls.list_files(alloc_id, "alloc/logs")}
assert "web.stdout.0" in logs and not logs["web.stdout.0"]["IsDir"] and logs["web.stdout.0"]["Size"] > 0, logs
task_dir = {f["Name"] for f in n.client.ls.list_files(alloc_id, "web")}
assert {"local", "secrets"} <= task_dir, task_dir
ok("client.ls.list_files")

# client.stream_logs.stream: frames, and plain.
text, _ = frames(n.client.stream_logs.stream(alloc_id, "web", "stdout"))
assert text.startswith("hello-from-web\n"), text
plain = n.client.stream_logs.stream(alloc_id, "web", "stdout", plain=True)
assert plain.startswith("hello-from-web\n"), plain
tail = n.client.stream_logs.stream(alloc_id, "web", "stdout", origin="end", offset=len("hello-from-web\n"), plain=True)
assert tail == "hello-from-web\n", tail
ok("client.stream_logs.stream")

# client.allocation.signal_allocation: the trap writes to the log.
assert n.client.allocation.signal_allocation(alloc_id, "SIGUSR1", "web") == {}
eventually("got-usr1 in the log", lambda: "got-usr1" in n.client.stream_logs.stream(alloc_id, "web", "stdout", plain=True))
signaled = n.allocation.get_allocation(alloc_id)["TaskStates"]["web"]["Events"]
assert any(e["Type"] == "Signaling" and e["TaskSignal"] == "SIGUSR1" for e in signaled), signaled
ok("client.allocation.signal_allocation")

# client.allocation.restart_allocation
assert n.client.allocation.restart_allocation(alloc_id) == {}
restarted = eventually(
    "the task restarted and running",
    lambda: (lambda s: s if s["Restarts"] == 1 and s["State"] == "running" else None)(
        n.allocation.get_allocation(alloc_id)["TaskStates"]["web"]
    ),
)
assert any(e["Type"] == "Restart Signaled" for e in restarted["Events"]), restarted["Events"]
ok("client.allocation.restart_allocation")

# event.stream.get_stream: the registration and the allocations' updates, in index order.
seen, deadline = [], time.monotonic() + LIMIT
while time.monotonic() < deadline:
    try:
        frame = events.get(timeout=1)
    except Exception:
        frame = None
    if frame:
        seen.append(frame)
    kinds = {(e["Topic"], e["Type"]) for f in seen for e in f["Events"]}
    started = {
        e["Key"]
        for f in seen
        for e in f["Events"]
        if e["Topic"] == "Allocation" and e["Payload"]["Allocation"]["JobID"] == "pyweb"
    }
    if ("Job", "JobRegistered") in kinds and {a["ID"] for a in allocs} <= started:
        break
else:
    raise AssertionError(f"the stream missed events: {seen}")
indexes = [f["Index"] for f in seen]
assert indexes == sorted(set(indexes)), indexes
registered = [e for f in seen for e in f["Events"] if e["Type"] == "JobRegistered"]
assert registered[0]["Key"] == "pyweb" and registered[0]["Payload"]["Job"]["ID"] == "pyweb", registered
assert all(e["Topic"] in ("Job", "Allocation") for f in seen for e in f["Events"]), seen
stream_exit.set()
ok("event.stream.get_stream")

# A blocking query returns when something changes: stopping the other allocation.
other = [a["ID"] for a in allocs if a["ID"] != alloc_id][0]
head = requests.get(ADDR + "/v1/allocations", headers={"X-Nomad-Token": TOKEN}, timeout=LIMIT)
index = int(head.headers["X-Nomad-Index"])
assert head.headers["X-Nomad-KnownLeader"] == "true" and "X-Nomad-LastContact" in head.headers
blocked = {}


def blocking():
    start = time.monotonic()
    answer = requests.get(
        ADDR + "/v1/allocations", params={"index": index, "wait": "30s"}, headers={"X-Nomad-Token": TOKEN}, timeout=LIMIT * 2
    )
    blocked["index"] = int(answer.headers["X-Nomad-Index"])
    blocked["took"] = time.monotonic() - start


waiter = threading.Thread(target=blocking)
waiter.start()
n.allocation.stop_allocation(other)
waiter.join(LIMIT)
assert blocked and blocked["index"] > index and blocked["took"] < 25, blocked
ok("blocking query")

# job.deregister_job: every allocation stopped, the job dead; then purged.
answer = n.job.deregister_job("pyweb")
assert answer["EvalID"], answer
eventually(
    "every allocation complete",
    lambda: all(a["DesiredStatus"] == "stop" and a["ClientStatus"] == "complete" for a in n.job.get_allocations("pyweb")),
)
assert n.job.get_job("pyweb")["Status"] == "dead" and n.job.get_job("pyweb")["Stop"] is True
n.job.deregister_job("pyweb", purge=True)
try:
    n.job.get_job("pyweb")
    raise AssertionError("a purged job is still there")
except nomad_errors.URLNotFoundNomadException:
    pass
ok("job.deregister_job")
