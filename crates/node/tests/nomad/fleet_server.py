"""python-nomad against a real `wharf fleet` with loopback workers: the fleet answers as
Nomad's server, and forwards the client node's calls to the worker that runs the allocation.
Each call's result is checked for the values the job produced. Prints one line `ok <call>`
per call checked; any failed check raises.

Environment: NOMAD_ADDR (http://host:port of the fleet), NOMAD_TOKEN (the fleet's token)."""

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
LIMIT = 30.0
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
    }
    task.update(task_extra)
    return {
        "Job": {
            "ID": job_id,
            "Name": job_id,
            "Type": "service",
            "Datacenters": ["dc1"],
            "Meta": {"owner": "fleet-tests"},
            "TaskGroups": [
                {
                    "Name": "g",
                    "Count": 2,
                    "RestartPolicy": {"Attempts": 3, "Interval": 60_000_000_000, "Delay": 100_000_000, "Mode": "fail"},
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
    """The data of a stream of JSON frames."""
    decoder, at, data = json.JSONDecoder(), 0, b""
    while at < len(text):
        while at < len(text) and text[at].isspace():
            at += 1
        if at >= len(text):
            break
        frame, at = decoder.raw_decode(text, at)
        if frame == {}:
            continue
        assert set(frame) >= {"Offset", "Data", "File", "FileEvent"}, frame
        data += base64.b64decode(frame["Data"])
    return data.decode()


# A wrong token: 403 with Nomad's words.
try:
    nomad.Nomad(address=ADDR, token="wrong-token", timeout=LIMIT).jobs.get_jobs()
    raise AssertionError("a wrong token was accepted")
except nomad_errors.URLNotAuthorizedNomadException as e:
    assert e.nomad_resp.status_code == 403 and e.nomad_resp.text == "Permission denied", e.nomad_resp.text
ok("token refused")

# A field wharf lacks: refused with its name, and nothing placed.
try:
    n.job.register_job("vaulted", job("vaulted", Vault={"Policies": ["db"]}))
    raise AssertionError("a job with Vault was accepted")
except nomad_errors.BadRequestNomadException as e:
    assert "Job.TaskGroups[0].Tasks[0].Vault" in e.nomad_resp.text, e.nomad_resp.text
assert n.allocations.get_allocations() == []
ok("vault refused")

# event.stream.get_stream, started before the job exists: its events arrive as the fleet
# places it.
stream, stream_exit, events = n.event.stream.get_stream(index=0, topic=["Job:fleetweb", "Allocation"], timeout=LIMIT * 3)
stream.daemon = True
stream.start()

# job.register_job: the fleet queues both instances and says the evaluation is complete.
answer = n.job.register_job("fleetweb", job("fleetweb"))
assert answer["EvalID"] and answer["JobModifyIndex"] > 0, answer
evaluation = n.evaluation.get_evaluation(answer["EvalID"])
assert evaluation["Status"] == "complete" and evaluation["JobID"] == "fleetweb", evaluation
assert evaluation["TriggeredBy"] == "job-register", evaluation
ok("job.register_job")

# jobs.get_jobs and job.get_job
mine = [j for j in n.jobs.get_jobs() if j["ID"] == "fleetweb"]
assert len(mine) == 1 and mine[0]["Type"] == "service" and mine[0]["Meta"] == {"owner": "fleet-tests"}, mine
assert mine[0]["Datacenters"] == ["dc1"] and "g" in mine[0]["JobSummary"]["Summary"], mine
shown = n.job.get_job("fleetweb")
assert shown["TaskGroups"][0]["Tasks"][0]["Config"]["command"] == "/bin/sh" and shown["Stop"] is False, shown
ok("jobs.get_jobs")

# job.get_allocations: one allocation per group instance, both running on a worker.
allocs = eventually(
    "both allocations running",
    lambda: (lambda a: a if len(a) == 2 and all(x["ClientStatus"] == "running" for x in a) else None)(
        n.job.get_allocations("fleetweb")
    ),
)
assert sorted(a["Name"] for a in allocs) == ["fleetweb.g[0]", "fleetweb.g[1]"], allocs
assert all(a["JobID"] == "fleetweb" and a["TaskGroup"] == "g" and a["DesiredStatus"] == "run" for a in allocs), allocs
# One allocation a worker (the fleet's `per_worker_limit = 1`): each on its own node.
assert all(a["NodeID"].startswith("loopback-") for a in allocs), allocs
assert len({a["NodeID"] for a in allocs}) == 2, allocs
ok("job.get_allocations")
alloc_id = sorted(allocs, key=lambda a: a["Name"])[0]["ID"]
other = [a["ID"] for a in allocs if a["ID"] != alloc_id][0]

# validate.validate_job: the translation's verdict, with the field named.
verdict = n.validate.validate_job(job("checked")).json()
assert verdict["ValidationErrors"] == [], verdict
verdict = n.validate.validate_job(job("checked", Vault={"Policies": ["app"]})).json()
assert "Job.TaskGroups[0].Tasks[0].Vault" in verdict["Error"], verdict
ok("validate.validate_job")

# allocations.get_allocations (prefix too)
listed = n.allocations.get_allocations()
assert {a["ID"] for a in listed} == {a["ID"] for a in allocs}, listed
prefixed = n.allocations.get_allocations(prefix=alloc_id[:8])
assert [a["ID"] for a in prefixed] == [alloc_id], prefixed
ok("allocations.get_allocations")

# allocation.get_allocation: the worker's task states, with Nomad's events.
alloc = n.allocation.get_allocation(alloc_id)
state = alloc["TaskStates"]["web"]
assert state["State"] == "running" and state["Failed"] is False and state["Restarts"] == 0, state
types = [e["Type"] for e in state["Events"]]
assert types[0] == "Received" and "Task Setup" in types and "Started" in types, types
assert alloc["Job"]["ID"] == "fleetweb" and alloc["Name"] == "fleetweb.g[0]" and alloc["EvalID"] == answer["EvalID"], alloc
ok("allocation.get_allocation")

# node.get_node: the worker, with its agent's address, resources and drivers.
node = n.node.get_node(alloc["NodeID"])
assert node["ID"] == alloc["NodeID"] and node["Status"] == "ready", node
assert node["HTTPAddr"] and "http://" + node["HTTPAddr"] != ADDR, (node["HTTPAddr"], ADDR)
assert node["Drivers"]["raw_exec"]["Healthy"] is True, node["Drivers"]
assert node["NodeResources"]["Memory"]["MemoryMB"] > 0, node["NodeResources"]
nodes = n.nodes.get_nodes()
assert sorted(s["ID"] for s in nodes) == sorted(a["NodeID"] for a in allocs), nodes
other_node = n.node.get_node([a["NodeID"] for a in allocs if a["ID"] == other][0])
assert other_node["HTTPAddr"] and other_node["HTTPAddr"] != node["HTTPAddr"], (other_node, node)
# The address is the worker agent's own Nomad API: it answers for the allocation, and
# wants the agent's token, not the fleet's.
direct = requests.get(f"http://{node['HTTPAddr']}/v1/allocation/{alloc_id}", headers={"X-Nomad-Token": TOKEN}, timeout=LIMIT)
assert direct.status_code == 403 and direct.text == "Permission denied", (direct.status_code, direct.text)
ok("node.get_node")

# agent.get_agent and the leader: the fleet is a server, and leads.
agent = n.agent.get_agent()
assert agent["config"]["Server"]["Enabled"] is True and agent["config"]["Client"]["Enabled"] is False, agent
assert agent["stats"]["nomad"]["leader"] == "true", agent
assert "http://" + n.status.leader.get_leader() == ADDR
ok("agent.get_agent")

# client.cat.read_file, through the fleet to the worker: the task's environment.
env = dict(
    line.split("=", 1)
    for line in eventually("env.txt written", lambda: n.client.cat.read_file(alloc_id, "alloc/env.txt")).splitlines()
)
assert env["NOMAD_ALLOC_ID"] == alloc_id and env["NOMAD_JOB_ID"] == "fleetweb", env
assert env["NOMAD_TASK_NAME"] == "web" and env["NOMAD_GROUP_NAME"] == "g", env
assert env["NOMAD_ALLOC_INDEX"] == "0" and env["NOMAD_ALLOC_NAME"] == "fleetweb.g[0]", env
# The other allocation's call goes to the other worker.
other_env = eventually("the other env.txt written", lambda: n.client.cat.read_file(other, "alloc/env.txt"))
assert f"NOMAD_ALLOC_ID={other}\n" in other_env and "NOMAD_ALLOC_NAME=fleetweb.g[1]\n" in other_env, other_env
ok("client.cat.read_file")

# client.ls.list_files: Nomad's layout.
root = {f["Name"]: f for f in n.client.ls.list_files(alloc_id, "/")}
assert root["alloc"]["IsDir"] and root["web"]["IsDir"], root
logs = {f["Name"] for f in n.client.ls.list_files(alloc_id, "alloc/logs")}
assert "web.stdout.0" in logs, logs
# The worker agent's refusal comes back as it said it: its directory confines the path.
escape = requests.get(
    f"{ADDR}/v1/client/fs/cat/{alloc_id}", params={"path": "../../../../etc/passwd"}, headers={"X-Nomad-Token": TOKEN}, timeout=LIMIT
)
assert escape.status_code == 403 and "would leave the allocation's directory" in escape.text, (escape.status_code, escape.text)
ok("client.ls.list_files")

# client.stream_logs.stream: frames, and plain.
assert frames(n.client.stream_logs.stream(alloc_id, "web", "stdout")).startswith("hello-from-web\n")
assert n.client.stream_logs.stream(alloc_id, "web", "stdout", plain=True).startswith("hello-from-web\n")
ok("client.stream_logs.stream")

# client.allocation.signal_allocation: the trap writes to the log, the worker's event shows.
assert n.client.allocation.signal_allocation(alloc_id, "SIGUSR1", "web") == {}
eventually("got-usr1 in the log", lambda: "got-usr1" in n.client.stream_logs.stream(alloc_id, "web", "stdout", plain=True))
signaled = n.allocation.get_allocation(alloc_id)["TaskStates"]["web"]["Events"]
assert any(e["Type"] == "Signaling" and e["TaskSignal"] == "SIGUSR1" for e in signaled), signaled
ok("client.allocation.signal_allocation")

# client.allocation.restart_allocation
assert n.client.allocation.restart_allocation(alloc_id) == {}
eventually(
    "the task restarted and running",
    lambda: (lambda s: s if s["Restarts"] == 1 and s["State"] == "running" else None)(
        n.allocation.get_allocation(alloc_id)["TaskStates"]["web"]
    ),
)
ok("client.allocation.restart_allocation")

# event.stream.get_stream: the registration and the allocations' placing, in index order.
seen, deadline = [], time.monotonic() + LIMIT
while time.monotonic() < deadline:
    try:
        frame = events.get(timeout=1)
    except Exception:
        frame = None
    if frame:
        seen.append(frame)
    kinds = {(e["Topic"], e["Type"]) for f in seen for e in f["Events"]}
    placed = {
        e["Key"]
        for f in seen
        for e in f["Events"]
        if e["Topic"] == "Allocation" and e["Payload"]["Allocation"]["JobID"] == "fleetweb"
    }
    if ("Job", "JobRegistered") in kinds and {a["ID"] for a in allocs} <= placed:
        break
else:
    raise AssertionError(f"the stream missed events: {seen}")
indexes = [f["Index"] for f in seen]
assert indexes == sorted(set(indexes)), indexes
registered = [e for f in seen for e in f["Events"] if e["Type"] == "JobRegistered"]
assert registered[0]["Key"] == "fleetweb" and registered[0]["Payload"]["Job"]["ID"] == "fleetweb", registered
stream_exit.set()
ok("event.stream.get_stream")

# A blocking query returns when the fleet's work changes: stopping the other allocation.
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
stopped = n.allocation.get_allocation(other)
assert stopped["DesiredStatus"] == "stop", stopped
ok("blocking query")

# job.deregister_job: every allocation stopped, the job dead; then purged.
answer = n.job.deregister_job("fleetweb")
assert answer["EvalID"], answer
eventually(
    "every allocation complete",
    lambda: all(a["DesiredStatus"] == "stop" and a["ClientStatus"] == "complete" for a in n.job.get_allocations("fleetweb")),
)
assert n.job.get_job("fleetweb")["Status"] == "dead" and n.job.get_job("fleetweb")["Stop"] is True
n.job.deregister_job("fleetweb", purge=True)
try:
    n.job.get_job("fleetweb")
    raise AssertionError("a purged job is still there")
except nomad_errors.URLNotFoundNomadException:
    pass
ok("job.deregister_job")
