// Multi-part message content through the official OpenAI JS SDK (the shape guidellm, the
// Agents SDK, the Vercel AI SDK and LangChain send). Usage:
//   node multipart_chat.cjs PREFIX BASE_URL MODEL
// PREFIX is the npm --prefix directory holding node_modules/openai. Prints one JSON object.
const path = require("node:path");
const { createRequire } = require("node:module");

async function main() {
  const [prefix, baseURL, model] = process.argv.slice(2);
  const sdk = createRequire(path.join(prefix, "package.json"))("openai");
  const OpenAI = sdk.default || sdk.OpenAI || sdk;
  const client = new OpenAI({ baseURL, apiKey: "k", maxRetries: 0, timeout: 120000 });
  const exact = { temperature: 0, ignore_eos: true,
                  chat_template_kwargs: { enable_thinking: false } };
  const parts = [
    { role: "system", content: [{ type: "text", text: "You are terse." },
                                { type: "text", text: "Answer in English." }] },
    { role: "user", content: [{ type: "text", text: "Part one." },
                              { type: "text", text: "Part two." }] },
  ];
  const joined = parts.map((m) => ({ role: m.role,
                                     content: m.content.map((p) => p.text).join("\n") }));
  const manifest = path.join(prefix, "node_modules", "openai", "package.json");
  const out = { sdk: JSON.parse(require("node:fs").readFileSync(manifest, "utf8")).version };
  const whole = await client.chat.completions.create({ model, messages: parts, max_tokens: 4,
                                                      ...exact });
  const plain = await client.chat.completions.create({ model, messages: joined, max_tokens: 4,
                                                      ...exact });
  out.parts = { text: whole.choices[0].message.content, usage: whole.usage,
                finish: whole.choices[0].finish_reason };
  out.joined = { text: plain.choices[0].message.content, usage: plain.usage };
  const stream = await client.chat.completions.create({
    model, messages: parts, max_tokens: 4, stream: true,
    stream_options: { include_usage: true }, ...exact });
  let text = "";
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.choices.length) text += chunk.choices[0].delta.content || "";
    if (chunk.usage) usage = chunk.usage;
  }
  out.stream = { text, usage };
  const response = await client.responses.create({
    model, max_output_tokens: 4, temperature: 0,
    input: [{ role: "user", content: [{ type: "input_text", text: "Part one." },
                                      { type: "input_text", text: "Part two." }] }] });
  out.responses = { status: response.status, usage: response.usage };
  try {
    await client.chat.completions.create({ model, max_tokens: 4,
                                           messages: [{ role: "user", content: [] }] });
    out.empty = { status: 200 };
  } catch (err) {
    out.empty = { status: err.status, message: err.error && err.error.message,
                  param: err.error && err.error.param };
  }
  process.stdout.write(JSON.stringify(out) + "\n");
}

main().catch((err) => { console.error(err); process.exit(1); });
