"""/v1/responses on the real server (smollm2:135m) through the `openai` SDK."""

import openai
import pytest

pytestmark = pytest.mark.models


@pytest.fixture(scope="module")
def client(base_url):
    return openai.OpenAI(base_url=base_url + "/v1", api_key="none", max_retries=0, timeout=120)


def test_response_and_its_stream_agree(client):
    r = client.responses.create(model="bubo", input="Name three colors.", instructions="Be brief.",
                                max_output_tokens=24, temperature=0)
    assert r.object == "response" and r.status in ("completed", "incomplete")
    assert [o.type for o in r.output] == ["message"] and r.output_text
    assert r.usage.output_tokens <= 24 and r.usage.output_tokens_details.reasoning_tokens == 0
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    if r.status == "incomplete":
        assert r.incomplete_details.reason == "max_output_tokens"

    with client.responses.stream(model="bubo", input="Name three colors.", instructions="Be brief.",
                                 max_output_tokens=24, temperature=0) as stream:
        events = list(stream)
    kinds = [ev.type for ev in events]
    # the terminal event carries the whole response (newer SDKs' get_final_response() takes only
    # response.completed, not response.incomplete)
    final = events[-1].response
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert "response.output_text.delta" in kinds and kinds[-1] in ("response.completed", "response.incomplete")
    assert final.output_text == r.output_text and final.usage.output_tokens == r.usage.output_tokens


def test_input_items_and_errors(client):
    r = client.responses.create(model="bubo", max_output_tokens=4, temperature=0, input=[
        {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello!"}]},
        {"role": "user", "content": "Name a color."}])
    assert r.usage.output_tokens <= 4
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="bubo", input=[])
    assert e.value.code == "missing_messages"
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="bubo", input="x", max_output_tokens=0)
    assert e.value.code == "invalid_value"
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="nope", input="x")
