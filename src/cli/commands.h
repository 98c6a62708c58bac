// Subcommands of `quern`: each src/cli/cmd_*.cpp defines one add_*_command()
// that registers its subcommand on the top-level app. One line per command.
#pragma once

namespace CLI {
class App;
}

void add_inspect_command(CLI::App& app);  // quern inspect MODEL [--json]: GGUF / safetensors metadata, tensors, totals
void add_run_command(CLI::App& app);  // quern run -p TEXT: generate text
void add_perplexity_command(CLI::App& app);  // quern perplexity -f TEXT: llama.cpp-style perplexity
void add_bench_command(CLI::App& app);  // quern bench: pp/tg tokens/s like llama-bench
void add_tokenize_command(CLI::App& app);  // quern tokenize [-m MODEL] -p TEXT | --jsonl: token ids
void add_detokenize_command(CLI::App& app);  // quern detokenize [-m MODEL] [-p IDS | --jsonl]: ids to text
void add_synth_command(CLI::App& app);  // quern synth PRESET --quant TYPE -o FILE: synthetic GGUF
void add_imatrix_command(CLI::App& app);  // quern imatrix -f TEXT: importance matrix for quantize --imatrix
void add_quantize_command(CLI::App& app);  // quern quantize IN OUT TYPE: requantize a GGUF model
void add_template_command(CLI::App& app);  // quern template --messages FILE: render a chat template
void add_chat_command(CLI::App& app);  // quern chat [-m MODEL]: interactive chat with the model's template
void add_serve_command(CLI::App& app);  // quern serve: OpenAI-compatible HTTP server
