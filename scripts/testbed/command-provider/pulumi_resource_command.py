"""Test-bed stand-in for pulumi-resource-command (the `command` package, `command:local:Command`).

The real provider's Go module has no tagged release and the Go module proxy serves none of its
pseudo-versions, so the test bed cannot build it. This plugin implements the subset of
`command:local:Command` (v1.2.1 schema) that the project's tests and examples use, on the provider SDK of
the PyPI `pulumi` package:

inputs  create, update, delete (shell commands run with `/bin/sh -c`), environment (map), dir, stdin,
        triggers (any change replaces), addPreviousOutputInEnv
outputs the inputs plus stdout and stderr (one trailing newline removed)

Like the real provider: nothing runs during preview; changing `create`/`dir`/`environment`/`stdin`
replaces the resource unless `update` is set (then the update command runs); `triggers` always replace;
`delete` runs with PULUMI_COMMAND_STDOUT/STDERR set; a non-zero exit fails the operation with its
output. A Cancel from the engine terminates the running commands.
"""

import asyncio
import json
import os
import signal
import sys
import uuid

from pulumi.provider.experimental import provider as p
from pulumi.provider.experimental.property_value import PropertyValue
from pulumi.provider.experimental.server import main

VERSION = "1.2.1"
TOKEN = "command:local:Command"
INPUTS = ["create", "update", "delete", "environment", "dir", "stdin", "triggers", "addPreviousOutputInEnv"]
REPLACE_ON = ["create", "dir", "environment", "stdin"]

STR = {"type": "string"}
SCHEMA = {
    "name": "command",
    "version": VERSION,
    "resources": {
        TOKEN: {
            "description": "Runs shell commands on create, update and delete (test-bed subset).",
            "inputProperties": {
                "create": STR,
                "update": STR,
                "delete": STR,
                "dir": STR,
                "stdin": STR,
                "environment": {"type": "object", "additionalProperties": STR},
                "triggers": {"type": "array", "items": {"$ref": "pulumi.json#/Any"}, "replaceOnChanges": True},
                "addPreviousOutputInEnv": {"type": "boolean"},
            },
            "properties": {
                "create": STR,
                "update": STR,
                "delete": STR,
                "dir": STR,
                "stdin": STR,
                "environment": {"type": "object", "additionalProperties": STR},
                "triggers": {"type": "array", "items": {"$ref": "pulumi.json#/Any"}},
                "addPreviousOutputInEnv": {"type": "boolean"},
                "stdout": STR,
                "stderr": STR,
            },
            "required": ["stdout", "stderr"],
        }
    },
}


# The SDK cannot marshal `Computed` values; on the wire an unknown is this sentinel string (Pulumi's
# `UnknownStringValue`), which the engine reads back as "computed" during previews.
UNKNOWN = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"


def unknown():
    return PropertyValue(UNKNOWN)


def plain(v):
    """PropertyValue (possibly nested) -> plain Python value."""
    if isinstance(v, PropertyValue):
        v = v.value
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    return v


def any_secret(props) -> bool:
    return any(isinstance(v, PropertyValue) and v.is_secret for v in props.values())


class CommandProvider(p.Provider):
    def __init__(self) -> None:
        self.running: set = set()

    async def get_schema(self, request):
        return p.GetSchemaResponse(schema=json.dumps(SCHEMA))

    async def check_config(self, request):
        return p.CheckResponse(inputs=request.new_inputs)

    async def diff_config(self, request):
        return p.DiffResponse(changes=False)

    async def configure(self, request):
        return p.ConfigureResponse(accept_secrets=True, supports_preview=True, accept_resources=True, accept_outputs=True)

    async def check(self, request):
        failures = []
        if request.type != TOKEN:
            failures.append(p.CheckFailure("", f"unknown resource type {request.type}"))
        news = request.new_inputs
        if "create" in news and not isinstance(plain(news["create"]), (str, type(None))):
            failures.append(p.CheckFailure("create", "create must be a string"))
        return p.CheckResponse(inputs=news, failures=failures or None)

    async def diff(self, request):
        olds, news = request.old_state, request.new_inputs
        diffs, replaces = [], []
        for k in INPUTS:
            if plain(olds.get(k)) != plain(news.get(k)):
                diffs.append(k)
                if k == "triggers" or (k in REPLACE_ON and plain(news.get("update")) is None):
                    replaces.append(k)
        return p.DiffResponse(changes=bool(diffs), diffs=diffs, replaces=replaces)

    async def run(self, cmd, props, extra_env):
        env = dict(os.environ)
        env.update({k: str(v) for k, v in (plain(props.get("environment")) or {}).items()})
        env.update(extra_env)
        stdin = plain(props.get("stdin"))
        proc = await asyncio.create_subprocess_exec(
            "/bin/sh", "-c", cmd,
            cwd=plain(props.get("dir")) or None,
            env=env,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        self.running.add(proc)
        try:
            out, err = await proc.communicate(stdin.encode() if stdin is not None else None)
        finally:
            self.running.discard(proc)
        out, err = out.decode(errors="replace"), err.decode(errors="replace")
        if proc.returncode != 0:
            raise RuntimeError(f"command exited with {proc.returncode}: {cmd!r}\nstdout: {out}\nstderr: {err}")
        return out.removesuffix("\n"), err.removesuffix("\n")

    def outputs(self, props, stdout, stderr):
        secret = any_secret(props)
        outs = {k: props[k] for k in INPUTS if k in props}
        outs["stdout"] = PropertyValue(stdout, is_secret=secret)
        outs["stderr"] = PropertyValue(stderr, is_secret=secret)
        return outs

    async def create(self, request):
        props = request.properties
        if request.preview:
            return p.CreateResponse(resource_id="", properties={**props, "stdout": unknown(), "stderr": unknown()})
        stdout, stderr = "", ""
        cmd = plain(props.get("create"))
        if cmd:
            stdout, stderr = await self.run(cmd, props, {})
        return p.CreateResponse(resource_id=f"{request.name}{uuid.uuid4().hex[:8]}", properties=self.outputs(props, stdout, stderr))

    async def update(self, request):
        news, olds = request.news, request.olds
        if request.preview:
            return p.UpdateResponse(properties={**news, "stdout": unknown(), "stderr": unknown()})
        stdout, stderr = plain(olds.get("stdout")) or "", plain(olds.get("stderr")) or ""
        cmd = plain(news.get("update"))
        if cmd:
            extra = {}
            if plain(news.get("addPreviousOutputInEnv")) is not False:
                extra = {"PULUMI_COMMAND_STDOUT": stdout, "PULUMI_COMMAND_STDERR": stderr}
            stdout, stderr = await self.run(cmd, news, extra)
        return p.UpdateResponse(properties=self.outputs(news, stdout, stderr))

    async def delete(self, request):
        props = request.properties
        cmd = plain(props.get("delete"))
        if cmd:
            extra = {"PULUMI_COMMAND_STDOUT": plain(props.get("stdout")) or "", "PULUMI_COMMAND_STDERR": plain(props.get("stderr")) or ""}
            await self.run(cmd, props, extra)

    async def read(self, request):
        return p.ReadResponse(resource_id=request.resource_id, properties=request.properties, inputs=request.inputs)

    async def cancel(self):
        for proc in list(self.running):
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass


if __name__ == "__main__":
    main(sys.argv[1:], VERSION, CommandProvider())
