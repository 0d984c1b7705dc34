"""Data of the Long Range Arena tasks (generators and loaders of the released formats), of
language modelling (corpora and tokenizers) and of translation (parallel text).

Every LRA loader returns a :class:`TaskData` of padded id tensors (id 0 = padding); see
:mod:`kattn.data.base` for the two padding-mask conventions. :func:`load_corpus` and
:func:`tokenize_corpus` give the :class:`LMData` of the language-modelling task.
:func:`gettext_corpus` (the translated gettext catalogues already on the machine),
:func:`load_iwslt` and :func:`load_parallel_files` give a :class:`ParallelCorpus`, which
:class:`JointBPE` and :func:`token_batches` turn into batches. :func:`load_images` reads image
classification sets (CIFAR, downsampled ImageNet, image folders, or the embedded shapes) as
:class:`ImageData`, and :class:`Augment` is their train-time augmentation. :func:`load_glue`
and :func:`load_agnews` read text-classification sets (GLUE's TSVs, AG News's CSVs) as
:class:`TextExamples`; :func:`embedded_text_classes` builds the embedded one from the gettext
catalogues on the machine.
"""

from .agnews import AGNEWS_CLASSES, ClassificationTexts, load_agnews, write_agnews_csv
from .base import PAD_ID, DataFormatError, SequenceDataset, TaskData, pad_sequences
from .corpus import (
    EMBEDDED_CORPUS_BYTES,
    SPLIT_FRACTIONS,
    Corpus,
    LMData,
    load_corpus,
    split_bytes,
    stdlib_corpus,
    stdlib_files,
    tokenize_corpus,
    unigram_bits_per_byte,
)
from .gettext_catalog import MoCatalog, MoEntry, read_mo
from .glue import GLUE_TASKS, GlueData, GlueTask, glue_task, load_glue
from .image import load_image, rgb_to_grayscale
from .image_augment import IMAGENET_MEAN, IMAGENET_STD, Augment, normalize
from .image_embedded import SHAPE_CLASSES, generate_shapes
from .images import ImageData, ImageSplit, embedded_images, load_images
from .listops import (
    LISTOPS_FILES,
    LISTOPS_LEGACY_VOCAB,
    LISTOPS_OOV_ID,
    LISTOPS_VOCAB,
    LISTOPS_VOCAB_SIZE,
    encode_listops,
    generate_listops,
    load_listops,
    tokenize_listops,
    write_listops,
)
from .parallel import (
    ParallelCorpus,
    gettext_corpus,
    load_iwslt,
    load_parallel_files,
)
from .parallel_batches import (
    JointBPE,
    ParallelBatch,
    collate_pairs,
    iterate_batches,
    token_batches,
)
from .pathfinder import draw_pathfinder, generate_pathfinder, load_pathfinder
from .retrieval import load_retrieval
from .text import load_text, pad_bytes
from .text_classification_embedded import embedded_text_classes, generate_text_classes
from .text_examples import TextExamples, encode_examples
from .tokenizers import (
    ByteTokenizer,
    HFTokenizer,
    SentencePieceTokenizer,
    Tokenizer,
    load_tokenizer,
)

__all__ = [
    "AGNEWS_CLASSES",
    "EMBEDDED_CORPUS_BYTES",
    "GLUE_TASKS",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "LISTOPS_FILES",
    "LISTOPS_LEGACY_VOCAB",
    "LISTOPS_OOV_ID",
    "LISTOPS_VOCAB",
    "LISTOPS_VOCAB_SIZE",
    "PAD_ID",
    "SHAPE_CLASSES",
    "SPLIT_FRACTIONS",
    "Augment",
    "ByteTokenizer",
    "ClassificationTexts",
    "Corpus",
    "DataFormatError",
    "GlueData",
    "GlueTask",
    "HFTokenizer",
    "ImageData",
    "ImageSplit",
    "JointBPE",
    "LMData",
    "MoCatalog",
    "MoEntry",
    "ParallelBatch",
    "ParallelCorpus",
    "SentencePieceTokenizer",
    "SequenceDataset",
    "TaskData",
    "TextExamples",
    "Tokenizer",
    "collate_pairs",
    "draw_pathfinder",
    "embedded_images",
    "embedded_text_classes",
    "encode_examples",
    "encode_listops",
    "generate_listops",
    "generate_pathfinder",
    "generate_shapes",
    "generate_text_classes",
    "gettext_corpus",
    "glue_task",
    "iterate_batches",
    "load_agnews",
    "load_corpus",
    "load_glue",
    "load_image",
    "load_images",
    "load_iwslt",
    "load_listops",
    "load_parallel_files",
    "load_pathfinder",
    "load_retrieval",
    "load_text",
    "load_tokenizer",
    "normalize",
    "pad_bytes",
    "pad_sequences",
    "read_mo",
    "rgb_to_grayscale",
    "split_bytes",
    "stdlib_corpus",
    "stdlib_files",
    "token_batches",
    "tokenize_corpus",
    "tokenize_listops",
    "unigram_bits_per_byte",
    "write_agnews_csv",
    "write_listops",
]
