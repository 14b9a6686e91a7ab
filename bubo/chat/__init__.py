"""Chat: rendering a model's chat template (sandboxed Jinja2)."""

from bubo.chat.template import ChatTemplate, ChatTemplateError, NoChatTemplateError

__all__ = ["ChatTemplate", "ChatTemplateError", "NoChatTemplateError"]
