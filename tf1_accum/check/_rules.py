"""The migration checker's rules, read from the tags of `_tags`: a ``_*_findings`` function
each, or for a rule found at one call, a test of that call."""

from __future__ import annotations

import ast
import typing
from collections.abc import Iterable, Iterator, Set as AbstractSet

from tf1_accum.check._compat import cached_property, unparse
from tf1_accum.check._flow import (
    COMPREHENSIONS, FUNCTIONS, Definition, Key, Table, argument_of, called_name,
)  # fmt: skip
from tf1_accum.check._tags import (
    ADDS, AFTER, APPLIES, APPLY, ASSIGNS, CONSTANT, COUNTER_MEAN, DIVIDED, GRADIENT, GRADIENTS,
    MEAN_GRADIENT, PLACEHOLDER, RERUN, SCALED, STEP, STEP_MEAN, SUM, VAR, ZERO_OP, Module, Tag,
    Vid, added_to, binary, kinds_of, operands,
)  # fmt: skip

#: (line, column, rule) of each finding.
Found = typing.Set[typing.Tuple[int, int, str]]
#: A ``.run(...)`` call and the tags of what it fetches.
Run = typing.Tuple[ast.Call, typing.FrozenSet[Tag]]

_GRADIENT_LISTS = (ast.ListComp, ast.GeneratorExp, ast.Tuple, ast.List, ast.Call)
_LITERALS = (ast.List, ast.Tuple, ast.Set, ast.Dict)
_CONTAINERS = (*_LITERALS, *COMPREHENSIONS)
_BLOCKS = ("body", "orelse", "finalbody", "handlers", "cases")
_LOOPS = (ast.For, ast.AsyncFor, ast.While)
#: The ops of a ``tf1_accum.build_accumulation`` result.
_WINDOW_OPS = frozenset({"zero_op", "accum_op", "apply_op", "accum_apply_op"})


def findings(tree: ast.Module, source: str, path: str, tables: Iterable[Table] = ()) -> Found:
    """The (line, column, rule) triples found in a parsed module."""
    module = Module(tree, source, path, tables)
    facts = _Facts(module)
    # TFA008, TFA009, TFA010 and TFA013, from the whole module
    whole = (_loop_findings, _refetch_findings, _one_run_findings, _schedule_findings)
    found: Found = set().union(*(rule(module, facts) for rule in whole))
    for call in facts.calls:
        name = called_name(call)
        if name == "initialized_value":  # TFA007: the call itself is the bug
            found.add(_at(call, "TFA007"))
        elif name in APPLIES and not module.callees(call):  # TFA001 to TFA005
            found |= _apply_findings(module, facts, call)
        elif name == "cond" and _cond_splits(module, facts, call):
            found.add(_at(call, "TFA006"))
        if name in ADDS | ASSIGNS and _running_average(module, facts, call):
            found.add(_at(call, "TFA005"))
        elif name in ("build_accumulation", "minimize") and _unweighted_mean(module, call):
            found.add(_at(call, "TFA014"))
    return found


def _at(node: ast.expr, rule: str) -> tuple[int, int, str]:
    """The (line, column, rule) of a finding at ``node``."""
    return (node.lineno, node.col_offset + 1, rule)


class _Facts:
    """What the whole module does to each variable (an accumulator or a counter?), its
    blocks of statements, and the runs that complete a ``range(n - 1)`` loop of adds."""

    def __init__(self, module: Module) -> None:
        self.module = module
        self.branch_functions: dict[int, list[Definition | ast.Lambda]] = {}  # by id(branch)
        self.adds: dict[Vid, list[tuple[frozenset[Tag], frozenset[Tag]]]] = {}  # value, control
        self.divided: dict[Vid, list[frozenset[Tag]]] = {}  # values of in-place divisions
        self.calls = [call for call, _ in module.calls]
        self.session_runs = [c for c in self.calls if getattr(c.func, "attr", None) == "run"]
        self.computes_gradients = any(called_name(c) in GRADIENTS for c in self.calls)
        for call in self.calls:
            accumulation = module.accumulation(call)
            if accumulation is not None:
                vids, value = accumulation
                control = module.lookup(("control", id(call)))
                for vid in added_to(call, vids):
                    self.adds.setdefault(vid, []).append((value, control))
            elif called_name(call) in ASSIGNS:
                vids, value = module.assigned(call) or (set(), frozenset())
                for vid in vids & kinds_of(value, DIVIDED):
                    self.divided.setdefault(vid, []).append(value)
            elif called_name(call) == "cond":
                for branch in cond_branches(call):
                    if branch is not None:
                        self.branch_functions[id(branch)] = _branch_functions(module, branch)
        self.in_branch = {id(f) for fs in self.branch_functions.values() for f in fs}
        self.blocks = _blocks(module.tree)
        self.completing = _completing_runs(module, self)  # by id(run)

    @cached_property
    def runs(self) -> list[Run]:
        return _runs(self.module, [self.module.tree])

    def is_counter(self, vid: Vid) -> bool:
        """A scalar variable, or one only ever added constants to (a step count)."""
        _, scalar = self.module.variable(vid)
        adds = self.adds.get(vid, ())
        return scalar or bool(adds) and all(value == {CONSTANT} for value, _ in adds)

    def is_accumulator(self, vid: Vid) -> bool:
        """A zero-initialised variable that the module adds tensors to."""
        zero, _ = self.module.variable(vid)
        return zero and bool(self.adds.get(vid)) and not self.is_counter(vid)

    def adds_again(self, vid: Vid) -> bool:
        """Running an add to vid once more changes it (not only constants are added)."""
        adds = self.adds.get(vid, ())
        return self.is_accumulator(vid) or any(value != {CONSTANT} for value, _ in adds)

    def sums_raw(self, vid: Vid) -> bool:
        """Adds gradients not already divided by the number of micro-batches."""
        return any(
            not ({SCALED, MEAN_GRADIENT} & value) and not (kinds_of(control, ZERO_OP) & {vid})
            for value, control in self.adds.get(vid, ())
        )


def _apply_findings(module: Module, facts: _Facts, call: ast.Call) -> Found:
    """TFA001 to TFA005, at the gradients given to ``apply_gradients``."""
    gradients = argument_of(call, 0, "grads_and_vars")
    if gradients is None:
        return set()
    tags = frozenset().union(*(module.tags(p) for p in _gradient_parts(module, gradients)))
    held = {v for v in kinds_of(tags, VAR, SUM) if facts.is_accumulator(v)}
    divided = [value for vid in held for value in facts.divided.get(vid, ())]
    reruns = {v for v in kinds_of(tags, RERUN) if facts.adds_again(v)}
    in_branch = any(id(outer) in facts.in_branch for outer in _enclosing(module, call))
    rules = {
        # sums of raw gradients, never divided in place, applied apart from the adds
        "TFA001": any(facts.sums_raw(v) and v not in facts.divided for v in held)
        and not _fused(facts, held),
        # divided by a counter variable, here or in place
        "TFA002": any(
            facts.is_counter(v) for t in [tags, *divided] for v in kinds_of(t, COUNTER_MEAN)
        ),
        # computed from the adds, outside a tf.cond, run apart, not as a window's last add
        "TFA003": bool(reruns)
        and not (in_branch or _fused(facts, reruns) or _completes(facts, reruns)),
        # fed back through placeholders by code that computes gradients (tests aside)
        "TFA004": PLACEHOLDER in tags and facts.computes_gradients and not _in_test(module, call),
        # divided by the global step
        "TFA005": STEP_MEAN in tags,
    }
    return {_at(gradients, rule) for rule, found in rules.items() if found}


def _gradient_parts(module: Module, node: ast.expr, depth: int = 0) -> list[ast.expr]:
    """The expressions in gradient position of a (gradient, variable) list:
    ``g`` of ``[(g, v) ...]``, ``a`` of ``zip(a, b)``, through names."""
    if isinstance(node, (ast.ListComp, ast.GeneratorExp)):
        return _gradient_parts(module, node.elt, depth)
    if isinstance(node, ast.Tuple) and len(node.elts) == 2:
        return [node.elts[0]]
    if isinstance(node, ast.Call) and called_name(node) == "zip" and len(node.args) == 2:
        return [node.args[0]]
    if isinstance(node, ast.Call) and called_name(node) in ("list", "tuple") and node.args:
        return _gradient_parts(module, node.args[0], depth)
    if isinstance(node, (ast.List, ast.Tuple)) and node.elts:
        return [p for e in node.elts for p in _gradient_parts(module, e, depth)]
    stored = module.stored(node) if depth < 3 else []
    # each value stored there gives its own parts (a call made elsewhere: itself)
    if stored and all(isinstance(v, _GRADIENT_LISTS) for v in stored):
        return [p for v in stored for p in _gradient_parts(module, v, depth + 1)]
    return [node]


def _fused(facts: _Facts, vids: AbstractSet[Vid]) -> bool:
    """Every session run that adds to these accumulators applies them too."""
    adding = [tags for _, tags in facts.runs if kinds_of(tags, SUM, AFTER) & vids]
    return bool(adding) and all(_applies(tags) for tags in adding)


def _completes(facts: _Facts, vids: AbstractSet[Vid]) -> bool:
    """Every run of an apply that adds to these again follows ``range(n - 1)`` adds."""
    fetched = [(run, facts.module.tags(_fetched(run))) for run in facts.session_runs]
    applying = [run for run, tags in fetched if _applies(tags) and kinds_of(tags, RERUN) & vids]
    return bool(applying) and all(id(run) in facts.completing for run in applying)


def _enclosing(module: Module, node: ast.AST) -> Iterator[ast.AST]:
    """The module, classes and functions ``node`` is evaluated in, innermost first."""
    scope = module.scope_of.get(id(node))
    while scope is not None:
        yield scope.node
        scope = scope.parent


def _in_test(module: Module, node: ast.AST) -> bool:
    """Inside a test function or test case class (which feed gradients on purpose)."""
    names = [getattr(outer, "name", "") for outer in _enclosing(module, node)]
    return any(n.startswith("test") or n.endswith(("Test", "TestCase")) for n in names)


def _running_average(module: Module, facts: _Facts, call: ast.Call) -> bool:
    """TFA005: ``avg.assign((avg * step + g) / (step + 1))``."""
    vids, value = module.assigned(call) or (set(), frozenset())
    return STEP_MEAN in value and any(
        facts.is_accumulator(v) or (GRADIENT in value and module.variable(v)[0]) for v in vids
    )


#: The wrappers whose ``minimize`` accumulates (each takes ``weight=``).
_WRAPPERS = {"AccumulationOptimizer", "KerasAccumulationOptimizer"}
_DIVISIONS = {"div", "divide", "truediv", "realdiv", "div_no_nan", "divide_no_nan"}
#: Calls that hand a count on: ``tf.cast(tf.reduce_sum(mask), tf.float32)``.
_HANDS_ON = {"cast", "to_float", "maximum", "minimum", "identity", "stop_gradient"}


def _unweighted_mean(module: Module, call: ast.Call) -> bool:
    """TFA014: ``build_accumulation(loss, ...)`` or ``AccumulationOptimizer(...).minimize(loss)``
    given no ``weight=``, where the loss divides by a count of the fed data."""
    builds = [] if module.callees(call) else [call]  # not the module's own function
    if called_name(call) == "minimize":  # what the receiver holds: the wrapper?
        held = _held(module, call.func.value) if isinstance(call.func, ast.Attribute) else []
        builds = [b for b in held if isinstance(b, ast.Call) and called_name(b) in _WRAPPERS]
    loss = argument_of(call, 0, "loss")
    weighed = any(k.arg in ("weight", None) for b in builds for k in b.keywords)
    return bool(builds) and loss is not None and not weighed and _data_mean(module, loss, set())


#: The window sizes: where each call that accumulates N micro-batches per update takes N.
_WINDOWS = {**dict.fromkeys(_WRAPPERS, 1), "build_dataset_accumulation": 3}
#: Where schedules, loops and hooks take a step count: by keyword, and by position.
_STEP_KEYWORDS = {
    "decay_steps", "first_decay_steps", "num_train_steps", "num_warmup_steps", "warmup_steps",
    "max_steps", "last_step", "total_steps", "boundaries",
}  # fmt: skip
_STEP_POSITIONS = {
    "exponential_decay": (2,), "polynomial_decay": (2,), "cosine_decay": (2,),
    "inverse_time_decay": (2,), "natural_exp_decay": (2,), "create_optimizer": (2, 3),
    "ExponentialDecay": (1,), "PolynomialDecay": (1,), "CosineDecay": (1,),
}  # fmt: skip


def _schedule_findings(module: Module, facts: _Facts) -> Found:
    """TFA013 at the ``/ batch_size`` of a step count given to a schedule (or ``max_steps``)
    in a module that accumulates N micro-batches per update, where no step count is
    divided by N and no size is told the accumulation (``micro_batch_size=``)."""
    builds = [call for call in facts.calls if called_name(call) in _WINDOWS]
    windows = [argument_of(b, _WINDOWS[called_name(b) or ""], "steps") for b in builds]
    told = any(k.arg == "micro_batch_size" for call in facts.calls for k in call.keywords)
    sizes = {unparse(window) for window in windows if window is not None}
    if told or not sizes:
        return set()

    def windowed(node: ast.AST) -> bool:  # names a window size
        return any(isinstance(n, ast.expr) and unparse(n) in sizes for n in ast.walk(node))

    def batched(node: ast.AST) -> bool:  # names a batch size
        names = (str(getattr(n, "id", None) or getattr(n, "attr", "")) for n in ast.walk(node))
        return any("batch_size" in name for name in names)

    if any(batched(d.left) and windowed(d.right) for d in _divisions(module.tree)):
        return set()  # batch_size / N: the batch size is the large batch's
    found: Found = set()
    for call in facts.calls:
        counts: list[ast.expr | None] = [k.value for k in call.keywords if k.arg in _STEP_KEYWORDS]
        counts += [argument_of(call, i) for i in _STEP_POSITIONS.get(called_name(call) or "", ())]
        for count in (c for c in counts if c is not None):
            values = _closure(module, count)
            if not any(windowed(value) for value in values):
                divisions = [d for value in values for d in _divisions(value)]
                found |= {_at(d, "TFA013") for d in divisions if batched(d.right)}
    return found


def _divisions(node: ast.AST) -> list[ast.BinOp]:
    """The ``a / b`` and ``a // b`` in ``node``."""
    return [
        n for n in ast.walk(node)
        if isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Div, ast.FloorDiv))
    ]  # fmt: skip


def _closure(module: Module, node: ast.expr) -> list[ast.expr]:
    """``node`` and what the names and attributes in it hold, each once (a few hundred)."""
    found, seen = [node], {id(node)}
    for value in found:  # grows as it is read
        for part in ast.walk(value) if len(found) < 300 else ():
            if isinstance(part, (ast.Name, ast.Attribute)):
                held = [v for v in module.stored(part) if id(v) not in seen]
                found += held
                seen |= {id(v) for v in held}
    return found


def _resolved(module: Module, node: ast.expr) -> list[ast.expr]:
    """What a name or attribute holds, or a call of the module's functions returns."""
    if isinstance(node, ast.Call):
        return [value for f, _ in module.callees(node) for value in module.returns(f)]
    return module.stored(node)  # [] for any other expression


def _data_mean(module: Module, node: ast.expr, seen: set[int]) -> bool:
    """``sum / tf.reduce_sum(mask)`` (or ``tf.math.divide``), or ``tf.reduce_mean`` of a
    ``tf.boolean_mask``: a mean over a count the fed data decides, in the loss or a term.
    ``seen``: the expressions already looked at (``loss += ...`` in a loop holds many)."""
    if id(node) in seen or len(seen) > 500:
        return False
    seen.add(id(node))
    held = _resolved(module, node)
    if held:
        return any(_data_mean(module, value, seen) for value in held)
    if binary(node, ast.Div):
        return _data_count(module, node.right, set()) or _data_mean(module, node.left, seen)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)):
        return any(_data_mean(module, side, seen) for side in (node.left, node.right))
    if not isinstance(node, ast.Call):
        return False
    name = called_name(node)
    if name in _DIVISIONS and len(node.args) == 2:
        numerator, count = node.args
        return _data_count(module, count, set()) or _data_mean(module, numerator, seen)
    values = argument_of(node, 0, "input_tensor") if name == "reduce_mean" else None
    return values is not None and module.holds(values, _sized_by_values)


def _data_count(module: Module, node: ast.expr, seen: set[int]) -> bool:
    """``tf.reduce_sum(mask)`` of no variable, through names, casts and ``+ epsilon``."""
    if id(node) in seen or len(seen) > 100:
        return False
    seen.add(id(node))
    held = _resolved(module, node)
    if held:
        return any(_data_count(module, value, seen) for value in held)
    if binary(node, ast.Add):
        return any(_data_count(module, side, seen) for side in (node.left, node.right))
    if not isinstance(node, ast.Call):
        return False
    name = called_name(node)
    if name in _HANDS_ON:
        return any(_data_count(module, argument, seen) for argument in node.args[:2])
    counted = argument_of(node, 0, "input_tensor", "input")
    if name not in ("reduce_sum", "count_nonzero") or counted is None:
        return False
    return not (kinds_of(module.tags(counted), VAR) or module.holds(counted, _fixed_size))


def _sized_by_values(node: ast.expr) -> bool:
    """A call whose result's size depends on the values of what it is given."""
    return isinstance(node, ast.Call) and called_name(node) in ("boolean_mask", "dynamic_partition")


def _fixed_size(node: ast.expr) -> bool:
    """``tf.ones_like(x)``, a literal: its sum counts positions, not what the data holds."""
    return isinstance(node, ast.Constant) or (
        isinstance(node, ast.Call) and called_name(node) in ("ones", "ones_like", "fill")
    )


def _cond_splits(module: Module, facts: _Facts, call: ast.Call) -> bool:
    """TFA006: ``tf.cond(pred, apply_fn, accumulate_fn)``."""
    branches = cond_branches(call)
    if None in branches:
        return False
    functions = [facts.branch_functions.get(id(branch), []) for branch in branches]
    calls = [[n for f in fs for n in ast.walk(f) if isinstance(n, ast.Call)] for fs in functions]
    applies = [[c for c in cs if called_name(c) in APPLIES | {"minimize"}] for cs in calls]
    adding = [[c for c in cs if _accumulates_in_branch(module, facts, c)] for cs in calls]
    added = [{k for c in adds for k in _names(module, operands(c)[1], depth=2)} for adds in adding]
    accumulates = [  # an apply that holds its own micro-batch accumulates it too
        bool(adding[i]) or any(_applies_current(module, c, added[1 - i]) for c in applies[i])
        for i in (0, 1)
    ]
    return any(applies[i] and not accumulates[i] and accumulates[1 - i] for i in (0, 1))


def cond_branches(call: ast.Call) -> list[ast.expr | None]:
    """The true and false branches of ``tf.cond(pred, true_fn, false_fn)`` (None: missing)."""
    return [argument_of(call, 1, "true_fn", "fn1"), argument_of(call, 2, "false_fn", "fn2")]


def _branch_functions(module: Module, branch: ast.expr) -> list[Definition | ast.Lambda]:
    """The function a ``tf.cond`` branch is, and the module's functions it calls."""
    functions: list[Definition | ast.Lambda] = [branch] if isinstance(branch, ast.Lambda) else []
    if isinstance(branch, (ast.Name, ast.Attribute)):
        fake = ast.Call(func=branch, args=[], keywords=[])
        functions = [f for f, _ in module.callees(fake, module.scope_of[id(branch)])]
    for function in functions:
        calls = [n for n in ast.walk(function) if isinstance(n, ast.Call)]
        functions += [f for c in calls for f, _ in module.callees(c) if f not in functions]
        if len(functions) > 50:
            break
    return functions


def _accumulates_in_branch(module: Module, facts: _Facts, call: ast.Call) -> bool:
    """An add to an accumulator, or of a tensor to a variable made elsewhere."""
    accumulation = module.accumulation(call)
    if accumulation is None:
        return False
    vids, value = accumulation
    if vids:
        return any(facts.is_accumulator(v) for v in vids)
    target, _ = operands(call)  # not None: an accumulation has both operands
    return target is not None and STEP not in module.tags(target) and value != {CONSTANT}


def _applies_current(module: Module, call: ast.Call, added: AbstractSet[Key]) -> bool:
    """``apply_gradients([((acc + g) / n, v)])``: the run's own micro-batch is applied."""
    if called_name(call) == "minimize":
        return True
    gradients = argument_of(call, 0, "grads_and_vars")
    parts = _gradient_parts(module, gradients) if gradients is not None else []
    return any(GRADIENT in module.tags(p) or _names(module, p) & added for p in parts)


def _names(module: Module, node: ast.AST | None, depth: int = 0) -> set[Key]:
    """The keys of the names in an expression, and in what they hold."""
    if node is None:
        return set()
    keys: set[Key] = set()
    for name in ast.walk(node):
        if isinstance(name, ast.Name):
            [key] = module.keys(name)
            keys.add(key)
            if depth < 2:
                for value, _ in module.values.get(key, ()):
                    keys |= _names(module, value, depth + 1)
    return keys


def _completing_runs(module: Module, facts: _Facts) -> dict[int, Run]:
    """The first run that applies after each ``range(n - 1)`` loop of adds, by id."""
    found: dict[int, Run] = {}
    short_loops = [
        (block, i, statement) for block in facts.blocks for i, statement in enumerate(block)
        if type(statement) is ast.For and _short_range(statement.iter)
    ]  # fmt: skip
    for block, index, loop in short_loops:
        if not any(_accumulates(facts, tags) for _, tags in _runs(module, loop.body)):
            continue
        for later in block[index + 1 :]:
            runs = _runs(module, [later])
            applying = [(run, tags) for run, tags in runs if _applies(tags)]
            if applying:
                found[id(applying[0][0])] = applying[0]
            if applying or any(_accumulates(facts, tags) for _, tags in runs):
                break
    return found


def _loop_findings(module: Module, facts: _Facts) -> Found:
    """TFA008: ``range(n - 1)`` adds then an apply alone, or an ``if`` that splits them."""
    found: Found = set()
    for run, tags in facts.completing.values():
        if not _accumulates(facts, tags):
            found.add(_at(run, "TFA008"))
    # if full: run(apply) else: run(accumulate); a branch that applies too is a choice.
    ifs = [s for block in facts.blocks for s in block if isinstance(s, ast.If) and s.orelse]
    for branch in ifs:
        sides = [_runs(module, branch.body), _runs(module, branch.orelse)]
        appliers = [[run for run, tags in side if _applies(tags)] for side in sides]
        adds = [any(_accumulates(facts, tags) for _, tags in side) for side in sides]
        for mine, other in ((0, 1), (1, 0)):
            if appliers[mine] and not adds[mine] and adds[other] and not appliers[other]:
                found.add(_at(appliers[mine][0], "TFA008"))
    return found


def _blocks(tree: ast.Module) -> list[list[ast.AST]]:
    """Every list of statements in the module, nested ones too."""
    blocks: list[list[ast.AST]] = []
    statements: list[ast.AST] = [tree]
    while statements:
        node = statements.pop()
        for block in (getattr(node, field, None) for field in _BLOCKS):
            if isinstance(block, list):
                blocks.append(block)
                statements += block
    return blocks


def _short_range(node: ast.expr) -> bool:
    """``range(n - 1)`` or ``range(1, n)``: one micro-batch short of a window."""
    if not (isinstance(node, ast.Call) and called_name(node) in ("range", "xrange")):
        return False
    one = node.args[0].right if len(node.args) == 1 and binary(node.args[0], ast.Sub) else None
    one = node.args[0] if len(node.args) == 2 else one
    return isinstance(one, ast.Constant) and one.value == 1


def _runs(module: Module, nodes: Iterable[ast.AST]) -> list[Run]:
    """The ``.run(...)`` calls in ``nodes`` (not in nested functions), with their tags."""
    found: list[Run] = []
    stack = list(nodes)
    while stack:
        node = stack.pop()
        if isinstance(node, (*FUNCTIONS, ast.ClassDef)):
            continue
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "run":
            found.append((node, module.tags(_fetched(node))))
        stack.extend(ast.iter_child_nodes(node))
    return sorted(found, key=lambda run: (run[0].lineno, run[0].col_offset))


def _fetched(run: ast.Call) -> ast.expr:
    """What ``session.run(fetches)`` (or ``op.run()``) fetches."""
    fetched = argument_of(run, 0, "fetches")
    return typing.cast(ast.Attribute, run.func).value if fetched is None else fetched


def _accumulates(facts: _Facts, tags: AbstractSet[Tag]) -> bool:
    """What a run fetches adds to an accumulator."""
    kinds = (SUM, AFTER, RERUN) if _applies(tags) else (SUM, AFTER)  # an apply reruns its adds
    return any(facts.is_accumulator(v) for v in kinds_of(tags, *kinds))


def _applies(tags: AbstractSet[Tag]) -> bool:
    return any(t[0] == APPLY for t in tags)


def _refetch_findings(module: Module, facts: _Facts) -> Found:
    """TFA009 at ``sess.run(acum / n)`` after ``for ...: sess.run(acum)``."""
    if not any(tag[0] == RERUN for run in facts.session_runs for tag in module.tags(_fetched(run))):
        return set()  # no run fetches anything computed from an add
    found: Found = set()
    for block in facts.blocks:
        for index, loop in enumerate(block):
            if not isinstance(loop, _LOOPS) or type(loop) is ast.For and _short_range(loop.iter):
                continue  # after range(n - 1), the run that adds again completes the window
            added = {
                vid for _, tags in _runs(module, loop.body)
                for vid in kinds_of(tags, SUM, RERUN, AFTER) if facts.adds_again(vid)
            }  # fmt: skip
            for run, _ in _runs(module, block[index + 1 :]) if added else ():
                parts = [module.tags(part) for part in _parts(module, _fetched(run))]
                if any(_rereads(tags, added) for tags in parts):
                    found.add(_at(run, "TFA009"))
                # a new window: the next add is its first
                added -= {vid for tags in parts for vid in kinds_of(tags, ZERO_OP)}
    return found


def _rereads(tags: AbstractSet[Tag], added: AbstractSet[Vid]) -> bool:
    """A fetch computed from an add to ``added``, not the add itself nor an apply."""
    return bool((kinds_of(tags, RERUN) - kinds_of(tags, SUM)) & added) and not _applies(tags)


def _parts(module: Module, node: ast.expr, once: bool = False, depth: int = 0) -> list[ast.expr]:
    """The expressions ``node`` fetches, one by one, through what holds them
    (``once``: only through names stored once, not a loop's variable)."""
    if isinstance(node, _LITERALS):
        items = node.values if isinstance(node, ast.Dict) else node.elts
        return [p for item in items for p in _parts(module, item, once, depth)]
    if once:
        stored = module.stored(node) if isinstance(node, ast.Name) and depth < 3 else []
        one = len(stored) == 1 and isinstance(stored[0], _LITERALS)
        return _parts(module, stored[0], once, depth + 1) if one else [node]
    if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
        element = node.value if isinstance(node, ast.DictComp) else node.elt
        return _parts(module, element, once, depth)
    if depth >= 3:
        return [node]
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        # ops["mean"]: the value kept under that key (or set as an item)
        items = [
            value for held in _held(module, node.value) if isinstance(held, ast.Dict)
            for name, value in zip(held.keys, held.values)
            if isinstance(name, ast.Constant) and name.value == node.slice.value
        ]  # fmt: skip
        return [p for i in items for p in _parts(module, i, once, depth + 1)] or [node]
    held = _held(module, node)
    if any(isinstance(value, _CONTAINERS) for value in held):  # items appended count alone
        return [p for value in held for p in _parts(module, value, once, depth + 1)]
    return [node]


def _held(module: Module, node: ast.expr, depth: int = 0) -> list[ast.expr]:
    """What a name or attribute holds, or a module function returns (a few levels)."""
    held = _resolved(module, node)
    if depth >= 3 or not held or len(held) > 20:  # many stores: their union is as good
        return [node]
    return [leaf for value in held for leaf in _held(module, value, depth + 1)]


def _one_run_findings(module: Module, facts: _Facts) -> Found:
    """TFA010 at ``session.run([accum_ops, train_op])`` or ``[acc.accum_op, acc.apply_op]``."""
    found: Found = set()
    for run in facts.session_runs:
        items = _parts(module, _fetched(run), once=True)
        tags = [module.tags(item) for item in items]
        added = [kinds_of(t, SUM) for t in tags if not _applies(t)]
        applied = [
            set(tag[1:]) - kinds_of(t, RERUN, AFTER) for t in tags for tag in t if tag[0] == APPLY
        ]
        raced = {v for a in added for b in applied for v in a & b if facts.is_accumulator(v)}
        ops = [i for i in items if isinstance(i, ast.Attribute) and i.attr in _WINDOW_OPS]
        # (window, op): two ops of one window
        fields = {(unparse(op.value), op.attr) for op in ops if not module.stored(op)}
        if raced or len({window for window, _ in fields}) < len(fields):
            found.add(_at(run, "TFA010"))
    return found
