// Copyright 2025 The tfcompress Authors. Licensed under the Apache License 2.0.

#ifndef TFCOMPRESS_COMMON_CC_OP_PREFIX_H_
#define TFCOMPRESS_COMMON_CC_OP_PREFIX_H_

// Every tfcompress op is registered as "TFCompress>Name" so that it can never
// collide with a TensorFlow op or another add-on's. This macro is the only
// place in C++ where the prefix is written; its Python twin is
// `tfcompress.ops._loader.op_name`.
//
//   REGISTER_OP(TFCOMPRESS_OP_NAME("PackBits"))  // "TFCompress>PackBits"
#define TFCOMPRESS_OP_NAME(name) "TFCompress>" name

#endif  // TFCOMPRESS_COMMON_CC_OP_PREFIX_H_
