/* case_json.h - turns a test case from tests/data (oneDNN graph-style op
 * description: op name, input shapes, attrs) into a cg_problem, the way the
 * server maps its wire request. Shared by the kernels tests. */
#ifndef CG_TESTS_CASE_JSON_H
#define CG_TESTS_CASE_JSON_H

#include <stdlib.h>

#include <cjson/cJSON.h>

#include "kt.h"

/* Storage the built problem points into. */
typedef struct kt_case {
  cg_problem p;
  int64_t in[2][CG_MAX_RANK + 2];
  int64_t lists[7][CG_MAX_ATTR_LEN];
} kt_case;

/* Reads $CG_TEST_DATA/name into a parsed cJSON tree (caller frees with
 * cJSON_Delete); fails the test when the file is missing or malformed. */
static inline cJSON *kt_load_json(const char *name) {
  const char *dir = getenv("CG_TEST_DATA");
  char path[1024];
  if (dir == NULL)
    fail_msg("CG_TEST_DATA is not set");
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    fail_msg("cannot open %s", path);
  char *buf = NULL;
  size_t len = 0, cap = 0, n;
  char chunk[65536];
  while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0) {
    if (len + n + 1 > cap) {
      size_t ncap = (len + n + 1) * 2;
      char *nb = realloc(buf, ncap);
      if (nb == NULL) {
        free(buf);
        fclose(f);
        fail_msg("out of memory reading %s", path);
      }
      buf = nb;
      cap = ncap;
    }
    memcpy(buf + len, chunk, n);
    len += n;
  }
  fclose(f);
  if (buf == NULL)
    fail_msg("%s is empty", path);
  buf[len] = '\0';
  cJSON *root = cJSON_Parse(buf);
  free(buf);
  if (root == NULL)
    fail_msg("%s: malformed JSON", path);
  return root;
}

/* Copies a JSON int array into store (at most cap values); returns the
 * list, empty when the item is absent. */
static inline cg_ints kt_json_ints(const cJSON *arr, int64_t *store,
                                   size_t cap) {
  cg_ints l = {store, 0};
  const cJSON *v;
  if (!cJSON_IsArray(arr))
    return l;
  cJSON_ArrayForEach(v, arr) {
    if (l.len == cap)
      fail_msg("list longer than %zu in test data", cap);
    store[l.len++] = (int64_t)v->valuedouble;
  }
  return l;
}

/* 1 when the JSON int list item equals got[0..n). */
static inline int kt_json_list_equal(const cJSON *item, const int64_t *got,
                                     int n) {
  int i = 0;
  const cJSON *v;
  cJSON_ArrayForEach(v, item) {
    if (i >= n || (int64_t)v->valuedouble != got[i])
      return 0;
    i++;
  }
  return i == n;
}

/* Builds c->p from case j. Names the server would reject while parsing
 * (unknown op/format/auto_pad) give CG_EINVAL with the server-style
 * message in err; otherwise returns 0. */
static inline int kt_case_build(const cJSON *j, kt_case *c, char *err,
                                size_t errlen) {
  const cJSON *attrs = cJSON_GetObjectItemCaseSensitive(j, "attrs");
  const char *opname =
      cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "op"));
  cg_problem *p = &c->p;
  cg_problem_init(p);
  p->dtype = CG_DTYPE_F32;
  if (cg_op_parse(opname, &p->op) != 0)
    return cg_errorf(err, errlen, CG_EINVAL, "op: unknown value \"%s\"",
                     opname ? opname : "(null)");
  const char *in0 =
      cg_op_outputs_weights(p->op) ? "src_shape" : "diff_dst_shape";
  const char *in1 =
      cg_op_outputs_weights(p->op) ? "diff_dst_shape" : "weights_input_shape";
  p->input_dims[0] = kt_json_ints(cJSON_GetObjectItemCaseSensitive(j, in0),
                                  c->in[0], CG_MAX_RANK + 2);
  p->input_dims[1] = kt_json_ints(cJSON_GetObjectItemCaseSensitive(j, in1),
                                  c->in[1], CG_MAX_RANK + 2);

  static const char *const names[7] = {
      "strides",        "pads_begin", "pads_end",     "dilations",
      "output_padding", "dst_shape",  "weights_shape"};
  cg_ints *dst[7] = {&p->attrs.strides,        &p->attrs.pads_begin,
                     &p->attrs.pads_end,       &p->attrs.dilations,
                     &p->attrs.output_padding, &p->attrs.dst_shape,
                     &p->attrs.weights_shape};
  for (int i = 0; i < 7; i++)
    *dst[i] = kt_json_ints(cJSON_GetObjectItemCaseSensitive(attrs, names[i]),
                           c->lists[i], CG_MAX_ATTR_LEN);
  const cJSON *groups = cJSON_GetObjectItemCaseSensitive(attrs, "groups");
  if (cJSON_IsNumber(groups))
    p->attrs.groups = (int64_t)groups->valuedouble;
  const char *s;
  s = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(attrs, "auto_pad"));
  if (s != NULL && cg_auto_pad_parse(s, &p->attrs.auto_pad) != 0)
    return cg_errorf(err, errlen, CG_EINVAL, "auto_pad: unknown value \"%s\"",
                     s);
  s = cJSON_GetStringValue(
      cJSON_GetObjectItemCaseSensitive(attrs, "data_format"));
  if (s != NULL && cg_data_format_parse(s, &p->attrs.data_format) != 0)
    return cg_errorf(err, errlen, CG_EINVAL,
                     "data_format: unknown value \"%s\"", s);
  s = cJSON_GetStringValue(
      cJSON_GetObjectItemCaseSensitive(attrs, "weights_format"));
  if (s != NULL && cg_weights_format_parse(s, &p->attrs.weights_format) != 0)
    return cg_errorf(err, errlen, CG_EINVAL,
                     "weights_format: unknown value \"%s\"", s);
  /* A shape *tensor* input: the data give only its logical dims, so feed
   * the attribute's values through the input path. */
  if (cJSON_GetObjectItemCaseSensitive(j, "dst_shape_tensor_dims") != NULL) {
    p->has_shape_input = 1;
    p->shape_input = p->attrs.dst_shape;
  }
  if (cJSON_GetObjectItemCaseSensitive(j, "weights_shape_tensor_dims") !=
      NULL) {
    p->has_shape_input = 1;
    p->shape_input = p->attrs.weights_shape;
  }
  return 0;
}

#endif
