//! Built-in chat templates, chosen by name (`--chat-template chatml`) for a model file that has
//! none or whose own one is not wanted. Each is written for the format its name stands for:
//! the turn markers and where the system message goes.

use super::CHATML_TEMPLATE;

/// Llama 3: header-wrapped roles, `<|eot_id|>` after each turn, BOS first.
const LLAMA3: &str = "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";

/// Mistral's `[INST]` format: no system role, so a system message is put before the next
/// user message's text; each answer ends with EOS.
const MISTRAL: &str = "{{ bos_token }}{% set pending = namespace(system='') %}{% for message in messages %}{% if message['role'] == 'system' %}{% set pending.system = message['content'] + '\\n\\n' %}{% elif message['role'] == 'user' %}{{ '[INST] ' + pending.system + message['content'] + ' [/INST]' }}{% set pending.system = '' %}{% else %}{{ ' ' + message['content'] + eos_token }}{% endif %}{% endfor %}";

/// Gemma: `user` and `model` turns; the system message opens the next user turn.
const GEMMA: &str = "{{ bos_token }}{% set pending = namespace(system='') %}{% for message in messages %}{% if message['role'] == 'system' %}{% set pending.system = message['content'] + '\\n\\n' %}{% elif message['role'] == 'assistant' %}{{ '<start_of_turn>model\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% else %}{{ '<start_of_turn>user\\n' + pending.system + message['content'] | trim + '<end_of_turn>\\n' }}{% set pending.system = '' %}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}";

/// Qwen 3: ChatML whose earlier answers lose their `<think>` blocks; `enable_thinking=false`
/// opens the answer with an empty one.
const QWEN3: &str = "{% for message in messages %}{% set content = message['content'] %}{% if message['role'] == 'assistant' and '</think>' in content %}{% set content = content.split('</think>')[-1].lstrip('\\n') %}{% endif %}{{ '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}{% endif %}";

/// The built-in templates by name.
pub const BUILTIN_TEMPLATES: [(&str, &str); 5] = [
    ("chatml", CHATML_TEMPLATE),
    ("llama3", LLAMA3),
    ("mistral", MISTRAL),
    ("gemma", GEMMA),
    ("qwen3", QWEN3),
];

/// The source of the built-in template `name`.
pub fn builtin_template(name: &str) -> Option<&'static str> {
    BUILTIN_TEMPLATES
        .iter()
        .find(|(builtin, _)| *builtin == name)
        .map(|(_, source)| *source)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::{ChatMessage, ChatTemplate};

    fn render(name: &str) -> String {
        let template = ChatTemplate::new(builtin_template(name).expect("built in"), "<s>", "</s>")
            .expect("compiles");
        let messages = [
            ChatMessage::system("Be brief."),
            ChatMessage::user("Hi"),
            ChatMessage::assistant("<think>x</think>\n\nHello"),
            ChatMessage::user("Bye"),
        ];
        template.render(&messages, true).expect("renders")
    }

    #[test]
    fn each_builtin_renders_its_format() {
        assert_eq!(
            render("chatml"),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>x</think>\n\nHello<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(
            render("qwen3"),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(
            render("llama3"),
            "<s><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n<think>x</think>\n\nHello<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
        );
        assert_eq!(
            render("mistral"),
            "<s>[INST] Be brief.\n\nHi [/INST] <think>x</think>\n\nHello</s>[INST] Bye [/INST]"
        );
        assert_eq!(
            render("gemma"),
            "<s><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n<think>x</think>\n\nHello<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
        );
    }
}
