"""What the OpenAPI schema promises is what the app answers: the error statuses in OpenAI's
shape, the stream and text media types, and no FastAPI 422 (the app answers 400). That the
running servers keep these promises is checked by tests/launch/test_fuzz.py."""

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from warmpath.protocol.http import JSONRoute, install_error_handlers
from warmpath.protocol.openai import CompletionRequest
from warmpath.protocol.openapi import BODY, TextCompletion, errors, generation, publish, status


def app() -> FastAPI:
    a = FastAPI()
    a.router.route_class = JSONRoute
    publish(a)
    install_error_handlers(a)

    @a.post("/v1/completions", responses=generation(TextCompletion, 429))
    async def completions(body: CompletionRequest, req: Request) -> Response:
        return JSONResponse({})

    @a.post("/x", responses=errors(*BODY, 409))
    async def x(body: CompletionRequest) -> dict:
        return {}

    @a.get("/health", responses=status(503))
    async def health() -> dict:
        return {"status": "ok"}

    @a.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> str:
        return ""

    return a


def test_statuses_and_media_types_as_answered():
    doc = app().openapi()   # what GET /openapi.json serves
    ops = {p: next(iter(v.values()))["responses"] for p, v in doc["paths"].items()}
    assert {p: sorted(r) for p, r in ops.items()} == {
        "/v1/completions": ["200", "400", "401", "413", "429"], "/x": ["200", "400", "401", "409", "413"],
        "/health": ["200", "503"], "/metrics": ["200"]}
    ok = ops["/v1/completions"]["200"]["content"]
    assert ok["application/json"]["schema"] == {"$ref": "#/components/schemas/TextCompletion"}
    assert ok["text/event-stream"]["schema"]["required"] == ["data"]
    assert ops["/x"]["409"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorBody"}
    assert list(ops["/metrics"]["200"]["content"]) == ["text/plain"]
    assert not {"HTTPValidationError", "ValidationError"} & set(doc["components"]["schemas"])

