"""Test-only entry: `python -m tests.server.kserve_sdk_client HTTP_URL GRPC_URL TEXTS_JSON PROMPT` calls a
server with
KServe's own Python SDK (`kserve.InferenceRESTClient`, `kserve.InferenceGRPCClient`, asyncio),
unmodified: health, model fscore scoring TEXTS, model fbeam on PROMPT, and (REST) the error a
request to an unknown model gets; it prints what it got as one JSON object {"rest": {...}, "grpc": {...}}.

A process of its own: kserve's generated gRPC messages and tritonclient's register the same
protobuf names (`inference.ServerLiveRequest`, ...) in protobuf's default pool, so the two SDKs
cannot be imported into one process (the server tests import tritonclient).
"""

import asyncio
import json
import sys

import kserve

def request(model, texts):
    return kserve.InferRequest(model_name=model, infer_inputs=[
        kserve.InferInput("TEXT", [len(texts)], "BYTES", data=list(texts))])


def outputs(response) -> dict:
    out = {}
    for o in response.outputs:
        value = o.as_numpy()
        out[o.name] = [v.decode() if isinstance(v, bytes) else v for v in value.tolist()] if o.datatype == "BYTES" \
            else value.tolist()
    return out


async def error_message(call) -> str:
    """What the SDK says when `call` fails (the server's message, if the SDK shows it)."""
    try:
        await call
    except Exception as exc:  # the REST client raises httpx.HTTPStatusError
        return str(exc)
    return "no error"


async def rest(http_url: str, texts: list[str], prompt: str) -> dict:
    client = kserve.InferenceRESTClient(kserve.RESTConfig(protocol="v2", timeout=30, retries=0))
    base = f"http://{http_url}"
    try:
        return {"health": [await client.is_server_live(base), await client.is_server_ready(base),
                           await client.is_model_ready(base, "fscore")],
                "score": outputs(await client.infer(base, request("fscore", texts), model_name="fscore")),
                "beam": outputs(await client.infer(base, request("fbeam", [prompt]), model_name="fbeam")),
                "error": await error_message(client.infer(base, request("nope", texts), model_name="nope"))}
    finally:
        await client.close()


async def grpc(grpc_url: str, texts: list[str], prompt: str) -> dict:
    client = kserve.InferenceGRPCClient(grpc_url, timeout=30, retries=0)
    try:
        return {"health": [await client.is_server_live(), await client.is_server_ready(),
                           await client.is_model_ready("fscore")],
                "score": outputs(await client.infer(request("fscore", texts))),
                "beam": outputs(await client.infer(request("fbeam", [prompt])))}
    finally:
        await client.close()


async def main(http_url: str, grpc_url: str, texts: list[str], prompt: str) -> dict:
    return {"rest": await asyncio.wait_for(rest(http_url, texts, prompt), 60),
            "grpc": await asyncio.wait_for(grpc(grpc_url, texts, prompt), 60)}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]))))
