"""The API-neutral domain that crosses the frontend contract, shared by gateway and frontend.

`proto/helios/v1/frontend.proto` (with `common.proto`) is the wire form; these typed, frozen
objects are what code on either side works with:

- `chat.py`: chat input (`ChatInput`, `ChatMessage`, `TextPart` / `ImagePart`, `ToolCall`,
  `ToolDefinition`, `ToolChoice`) and `CompletionInput`;
- `generate.py`: `GenerateRequest`, `Sampling`, `ResponseFormat`;
- `events.py`: the Generate event stream (`Started`, `TextDelta`, `ReasoningDelta`,
  `ToolCallDelta`, `Finish`, `UsageReport`), `Usage`, logprobs, `FinishReason`;
- `model_card.py`: `ModelCard` (ListModels);
- `json_values.py`: JSON text <-> values, the way the contract writes and reads them;
- `convert/`: the protobuf edge, one `*_to_pb` / `*_from_pb` pair per message.

The gateway builds requests and reads events; the frontend reads requests and builds events.
Both use the same classes and the same conversions, so the two sides cannot drift. Only
`convert/` imports generated stubs.
"""
