// config_keys.h — internal to the config system (config.c, config_load.c): the row type of the
// key table (the table itself is KEYS in config.c).
//
// Every key of Config is one row: name, type, where it lives, default (as text, parsed like a
// YAML value), range, doc. Defaults, YAML loading, overrides, validation, printing and the
// Markdown key table (docs/config.md) are all driven from this one table.
#pragma once
#include <stddef.h>

#include "config.h"

typedef enum { K_INT, K_U64, K_FLOAT, K_BOOL, K_STR, K_ENUM } KeyType;

typedef struct ConfigKey {
    const char* name;   // "section.key"
    KeyType type;
    size_t off;         // offset of the field in Config
    size_t size;        // sizeof the field (checked against the type once, in config_defaults)
    const char* def;    // default, as text
    double lo, hi;      // inclusive range for K_INT / K_FLOAT
    const char* enums;  // K_ENUM: "a|b|c", value = index
    const char* doc;    // one line for docs/config.md and config_print comments
} ConfigKey;

// The table, in section order.
const ConfigKey* config_keys(int* n);
// Key by full name "section.key", or NULL.
const ConfigKey* config_key(const char* name);
// 1 when `s` is a section name (model, parallel, ...).
int config_is_section(const char* s);
// The section names, joined by ", ".
const char* config_section_list(void);

// Parses `text` as the value of key k into c. `where` prefixes the message ("file:3:5" or
// "command line"). A YAML null (empty, ~, null) is passed as text "" with is_null = 1.
int config_set_value(Config* c, const ConfigKey* k, const char* text, int is_null, const char* where, Err* e);

// " (did you mean train.seq_len?)" for the nearest key, or the list of valid keys of the section
// when nothing is close. section may be unknown (then sections are suggested).
void config_suggest_key(const char* section, const char* key, char* out, size_t n);
// " (did you mean train?)" or the list of sections.
void config_suggest_section(const char* section, char* out, size_t n);
