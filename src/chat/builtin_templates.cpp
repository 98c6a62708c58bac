// Built-in chat templates for models whose file carries none. Each lays out
// the conversation in its family's published prompt format; message content
// may be text or a list of {"type": "text", "text": ...} parts.
#include <map>

#include "chat/chat.h"
#include "tokenizer/tokenizer.h"

namespace quern::chat {

namespace {

// Text of a message's content: a string, or the text parts of a list.
#define QUERN_TEXT_MACRO                                                                                  \
    "{%- macro text(c) -%}{%- if c is string -%}{{ c }}{%- elif c is iterable and c is not mapping -%}" \
    "{%- for p in c -%}{%- if p is mapping and p.type == 'text' -%}{{ p.text }}"                         \
    "{%- elif p is string -%}{{ p }}{%- endif -%}{%- endfor -%}{%- endif -%}{%- endmacro -%}"

const std::map<std::string, std::string, std::less<>>& templates() {
    static const std::map<std::string, std::string, std::less<>> t = {
        {"chatml",
         QUERN_TEXT_MACRO
         "{%- for m in messages -%}"
         "{{- '<|im_start|>' + m.role + '\\n' + text(m.content) + '<|im_end|>\\n' -}}"
         "{%- endfor -%}"
         "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"},
        {"llama2",
         QUERN_TEXT_MACRO
         "{%- if messages and messages[0].role == 'system' -%}"
         "{%- set sys = '<<SYS>>\\n' + text(messages[0].content) + '\\n<</SYS>>\\n\\n' -%}"
         "{%- set msgs = messages[1:] -%}"
         "{%- else -%}{%- set sys = '' -%}{%- set msgs = messages -%}{%- endif -%}"
         "{%- for m in msgs -%}"
         "{%- set c = (sys if loop.first else '') + text(m.content)|trim -%}"
         "{%- if m.role == 'user' -%}{{- bos_token + '[INST] ' + c + ' [/INST]' -}}"
         "{%- elif m.role == 'assistant' -%}{{- ' ' + c + ' ' + eos_token -}}{%- endif -%}"
         "{%- endfor -%}"},
        {"llama3",
         QUERN_TEXT_MACRO
         "{{- bos_token -}}"
         "{%- for m in messages -%}"
         "{{- '<|start_header_id|>' + m.role + '<|end_header_id|>\\n\\n' + text(m.content)|trim + '<|eot_id|>' -}}"
         "{%- endfor -%}"
         "{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}"},
        {"mistral",
         QUERN_TEXT_MACRO
         "{%- if messages and messages[0].role == 'system' -%}"
         "{%- set sys = text(messages[0].content) + '\\n\\n' -%}{%- set msgs = messages[1:] -%}"
         "{%- else -%}{%- set sys = '' -%}{%- set msgs = messages -%}{%- endif -%}"
         "{{- bos_token -}}"
         "{%- for m in msgs -%}"
         "{%- if m.role == 'user' -%}{{- '[INST] ' + (sys if loop.first else '') + text(m.content) + ' [/INST]' -}}"
         "{%- elif m.role == 'assistant' -%}{{- text(m.content) + eos_token -}}{%- endif -%}"
         "{%- endfor -%}"},
        {"gemma",
         QUERN_TEXT_MACRO
         "{%- if messages and messages[0].role == 'system' -%}"
         "{%- set sys = text(messages[0].content) + '\\n\\n' -%}{%- set msgs = messages[1:] -%}"
         "{%- else -%}{%- set sys = '' -%}{%- set msgs = messages -%}{%- endif -%}"
         "{{- bos_token -}}"
         "{%- for m in msgs -%}"
         "{{- '<start_of_turn>' + ('model' if m.role == 'assistant' else 'user') + '\\n' + "
         "(sys if loop.first else '') + text(m.content)|trim + '<end_of_turn>\\n' -}}"
         "{%- endfor -%}"
         "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}"},
        {"phi3",
         QUERN_TEXT_MACRO
         "{%- for m in messages -%}"
         "{{- '<|' + m.role + '|>\\n' + text(m.content) + '<|end|>\\n' -}}"
         "{%- endfor -%}"
         "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- else -%}{{- eos_token -}}{%- endif -%}"},
    };
    return t;
}

}  // namespace

const std::vector<std::string>& builtin_template_names() {
    static const std::vector<std::string> names = {"chatml", "llama2", "llama3", "mistral", "gemma", "phi3"};
    return names;
}

std::optional<std::string> builtin_template(std::string_view name) {
    const auto it = templates().find(name);
    if (it == templates().end()) return std::nullopt;
    return it->second;
}

std::string guess_builtin_template(const Tokenizer& tok) {
    auto has = [&](std::string_view t) { return tok.token_id(t).has_value(); };
    if (has("<|im_start|>")) return "chatml";
    if (has("<|eot_id|>") && has("<|start_header_id|>")) return "llama3";
    if (has("<start_of_turn>")) return "gemma";
    if (has("<|user|>") && has("<|end|>")) return "phi3";
    if (has("[INST]")) return "mistral";
    if (tok.spm_like() && tok.bos() >= 0) return "llama2";
    return "chatml";
}

}  // namespace quern::chat
