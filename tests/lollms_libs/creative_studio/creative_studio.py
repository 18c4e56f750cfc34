"""
creative_studio.py — LCP omni-tool that composes image + text + music
using the host's LollmsClient before returning a single unified result.
"""
import uuid
from pathlib import Path
from typing import Any, Dict, Optional

TOOL_LIBRARY_NAME = "Creative Studio"
TOOL_LIBRARY_DESC = "Generates an illustrated, captioned audio story in one pipeline."
TOOL_LIBRARY_ICON = "🎨"

def tool_create_illustrated_audio_story(
    subject: str,
    style: str = "watercolor",
    with_music: bool = True,
    lollms_client_instance=None,
) -> Dict[str, Any]:
    """
    Creates an illustrated audio story: generates an illustration, writes a poetic
    caption for it, and optionally composes a background music theme.

    Args:
        subject (str): The topic of the story (e.g. 'a lighthouse in a storm').
        style (str): The art style for the illustration (e.g. 'watercolor', 'pixel art').
        with_music (bool): Whether to also generate a background music theme.
    """
    client = lollms_client_instance
    if client is None:
        return {"success": False,
                "error": "This tool requires a host-injected LollmsClient instance."}

    missing = [name for name, attr in
               (("text", client.llm), ("image", client.tti))] if client else []
    if client.llm is None or client.tti is None:
        return {"success": False,
                "error": f"Missing required modality bindings: text (LLM) and image (TTI) must be configured."}

    try:
        # 1. Image generation (TTI) — returns raw image bytes
        image_bytes = client.generate_image(
            prompt=f"{style} illustration of {subject}, highly detailed, dramatic lighting",
            width=1024,
            height=1024,
        )
        image_name = f"story_{uuid.uuid4().hex[:8]}.png"
        Path(image_name).write_bytes(image_bytes)

        # 2. Text generation (LLM) — caption the artwork we just produced
        caption = str(client.generate_text(
            prompt=(
                f"Write a two-sentence poetic caption for a {style} illustration "
                f"of {subject}. Return only the caption text."
            ),
            n_predict=128,
        )).strip()

        # 3. Music generation (TTM) — optional, guarded on binding availability
        music_path = None
        if with_music and client.ttm is not None:
            music_result = client.generate_music(
                prompt=f"Gentle ambient orchestral theme evoking {subject}"
            )
            if isinstance(music_result, (bytes, bytearray)):
                music_path = f"theme_{uuid.uuid4().hex[:8]}.wav"
                Path(music_path).write_bytes(music_result)

        return {
            "success": True,
            "output": (
                f"Created illustrated audio story about '{subject}': "
                f"image '{image_name}'" + (f", music '{music_path}'" if music_path else "")
                + f". Caption: \"{caption}\""
            ),
            "image_filename": image_name,
            "caption": caption,
            "music_filename": music_path,
            "prompt_injection": (
                f"\n\n✅ **Illustrated audio story ready for '{subject}'.** "
                f"Show the artwork using `<artefact_image id=\"{image_name}::0\" />`, "
                f"read the caption \"{caption}\" to the user"
                + (f", and mention the soundtrack `{music_path}`." if music_path else ".")
            ),
        }
    except Exception as ex:
        return {"success": False, "error": f"Creative pipeline failed: {ex}"}
