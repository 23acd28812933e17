"""An import-linter contract type that import-linter does not have: no import cycle
among the given packages' modules, at any depth and across packages (imports inside
functions count: they hide a cycle, they do not break it). `make lint` runs it through
`lint-imports` (pyproject.toml, [tool.importlinter])."""

from importlinter.application import output
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck


def strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative: the groups of modules that import each other."""
    index, low, on_stack, stack, groups = {}, {}, set(), [], []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, imported = work[-1]
            for other in imported:
                if other not in index:
                    index[other] = low[other] = len(index)
                    stack.append(other)
                    on_stack.add(other)
                    work.append((other, iter(sorted(edges[other]))))
                    break
                if other in on_stack:
                    low[module] = min(low[module], index[other])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[module])
                if low[module] == index[module]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == module:
                            break
                    if len(group) > 1:
                        groups.append(sorted(group))
    return groups


class AcyclicModulesContract(Contract):
    type_name = "acyclic_modules"

    packages = fields.ListField(subfield=fields.StringField())

    def check(self, graph, verbose: bool) -> ContractCheck:
        roots = set(self.packages)
        ours = {module for module in graph.modules if module.split(".")[0] in roots}
        edges = {
            module: {
                other for other in graph.find_modules_directly_imported_by(module) if other in ours
            }
            for module in ours
        }
        cycles = strongly_connected(edges)
        imports = [
            [(module, sorted(edges[module] & set(group))) for module in group] for group in cycles
        ]
        return ContractCheck(kept=not cycles, metadata={"cycles": imports})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for group in check.metadata["cycles"]:
            output.print_error("These modules import each other:")
            output.new_line()
            for module, imported in group:
                output.indent_cursor()
                output.print_error(f"{module} imports {', '.join(imported)}", bold=False)
            output.new_line()
