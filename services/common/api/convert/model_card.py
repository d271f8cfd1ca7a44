"""Model cards <-> `helios.v1.ModelCard` (ListModels)."""

from __future__ import annotations

from services.common.api.model_card import ModelCard
from services.common.pb import common_pb2, frontend_pb2


def model_card_to_pb(card: ModelCard) -> frontend_pb2.ModelCard:
    return frontend_pb2.ModelCard(
        id=card.id, aliases=list(card.aliases), root=card.root,
        max_model_len=card.max_model_len,
        capabilities=common_pb2.Capabilities(tools=card.tools, vision=card.vision,
                                             reasoning=card.reasoning),
        created=card.created, owned_by=card.owned_by, architecture=card.architecture,
        family=card.family, num_parameters=card.num_parameters, dtype=card.dtype,
        size_bytes=card.size_bytes, digest=card.digest, chat_template=card.chat_template,
        max_num_seqs=card.max_num_seqs, max_waiting=card.max_waiting,
        image_limits=common_pb2.ImageLimits(max_images=card.max_images,
                                            max_image_bytes=card.max_image_bytes,
                                            max_image_pixels=card.max_image_pixels))


def model_card_from_pb(pb: frontend_pb2.ModelCard) -> ModelCard:
    caps = pb.capabilities
    return ModelCard(
        id=pb.id, aliases=tuple(pb.aliases), root=pb.root, max_model_len=pb.max_model_len,
        tools=caps.tools, vision=caps.vision, reasoning=caps.reasoning, created=pb.created,
        owned_by=pb.owned_by or "helios", architecture=pb.architecture, family=pb.family,
        num_parameters=pb.num_parameters, dtype=pb.dtype, size_bytes=pb.size_bytes,
        digest=pb.digest, chat_template=pb.chat_template, max_num_seqs=pb.max_num_seqs,
        max_waiting=pb.max_waiting, max_images=pb.image_limits.max_images,
        max_image_bytes=pb.image_limits.max_image_bytes,
        max_image_pixels=pb.image_limits.max_image_pixels)
